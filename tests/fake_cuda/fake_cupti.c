/*
 * A tiny fake libcupti for the shim's CPU tests: cuptiSubscribe (refused with
 * CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED when FAKE_CUPTI_BUSY=1, as when Nsight holds
 * it), cuptiEnableCallback (each enabled callback id is appended to $FAKE_CUPTI_LOG), and
 * API_ENTER/API_EXIT callbacks for the launches of the fake libcuda.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"

#include <cupti_callbacks.h>

#define API __attribute__((visibility("default")))
#define MAX_CBID 4096

static CUpti_CallbackFunc sub_cb;
static void *sub_ud;
static int enabled[MAX_CBID];

static void dispatch(unsigned cbid, const void *params, const CUresult *result)
{
    if (cbid >= MAX_CBID || !enabled[cbid] || !sub_cb)
        return;
    CUpti_CallbackData d;
    memset(&d, 0, sizeof d);
    d.functionParams = params;
    /* the fake libcuda calls once before the launch (result NULL) and once after */
    d.functionReturnValue = (void *)result; /* CUPTI declares it non-const */
    d.callbackSite = result ? CUPTI_API_EXIT : CUPTI_API_ENTER;
    sub_cb(sub_ud, CUPTI_CB_DOMAIN_DRIVER_API, cbid, &d);
}

API CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *h, CUpti_CallbackFunc cb, void *ud)
{
    const char *busy = getenv("FAKE_CUPTI_BUSY");
    if (busy && strcmp(busy, "1") == 0)
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void (*set)(fake_api_callback) = cu ? (void (*)(fake_api_callback))dlsym(cu, "fakeSetApiCallback") : NULL;
    if (!set)
        return CUPTI_ERROR_NOT_INITIALIZED;
    sub_cb = cb;
    sub_ud = ud;
    *h = (CUpti_SubscriberHandle)&sub_cb;
    set(dispatch);
    return CUPTI_SUCCESS;
}

API CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle h)
{
    (void)h;
    sub_cb = NULL;
    return CUPTI_SUCCESS;
}

API CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle h, CUpti_CallbackDomain dom,
                                    CUpti_CallbackId cbid)
{
    if (!h || dom != CUPTI_CB_DOMAIN_DRIVER_API || cbid >= MAX_CBID)
        return CUPTI_ERROR_INVALID_PARAMETER;
    enabled[cbid] = (int)enable;
    const char *log = getenv("FAKE_CUPTI_LOG");
    FILE *f = log ? fopen(log, "a") : NULL;
    if (f) {
        fprintf(f, "%u %u\n", (unsigned)cbid, (unsigned)enable);
        fclose(f);
    }
    return CUPTI_SUCCESS;
}

API CUptiResult cuptiGetVersion(uint32_t *v)
{
    *v = 130001;
    return CUPTI_SUCCESS;
}

API CUptiResult cuptiGetResultString(CUptiResult r, const char **s)
{
    *s = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ? "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
                                                              : "CUPTI_ERROR_UNKNOWN";
    return CUPTI_SUCCESS;
}
