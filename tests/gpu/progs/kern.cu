// Kernels loaded as a module (fatbin) by the driver-API programs (c02_getproc.c, c03_launch_drv.c).
// extern "C": the function names stay "touch2" and "tiny3" in the module and in the capture.
extern "C" __global__ void touch2(const float *a, float *b, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        b[i] = a[i] + 1.0f;
}

extern "C" __global__ void tiny3(float *a, float *b, float *c)
{
    if (threadIdx.x == 0x7fffffff) /* never: keeps the three pointer parameters */
        a[0] = b[0] + c[0];
}
