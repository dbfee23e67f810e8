"""gpt.py with torch.profiler (CUDA activity only) over steps PROF_AT..PROF_AT+1; chrome trace to PROF_OUT."""
import os, sys, runpy
sys.path.insert(0, os.path.join(os.getcwd(), "scripts", "workloads"))
import _common
K = int(os.environ.get("PROF_AT", "12"))
orig = _common.torch_train
def tt(torch, rec, steps, step_fn):
    from torch.profiler import profile, ProfilerActivity
    st = {}
    def f(i):
        if i == K:
            st["p"] = profile(activities=[ProfilerActivity.CUDA]); st["p"].__enter__()
        if i == K + 2:
            st["p"].__exit__(None, None, None); st["p"].export_chrome_trace(os.environ["PROF_OUT"])
        return step_fn(i)
    orig(torch, rec, steps, f)
_common.torch_train = tt
sys.argv = ["gpt.py"] + sys.argv[1:]
runpy.run_path("scripts/workloads/gpt.py", run_name="__main__")
