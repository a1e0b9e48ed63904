import torch, time
from interq.quant import kernels
kernels.load(); k=kernels.get()
torch.set_num_threads(1)
for shape in [(64,1536),(4040,1536)]:
    x=torch.randn(*shape)
    n=max(1,int(2e7/x.numel()))
    for f,name in [(lambda: k.fake_quant_act_int8(x,127),"fq"),(lambda: k.quant_act_int8(x,127),"q"),(lambda: x*1.0001,"mul"),(lambda: x.abs().amax(-1),"amax")]:
        f(); c=time.perf_counter()
        for _ in range(n): f()
        t=(time.perf_counter()-c)/n
        print(shape,name,"%.3f ms  %.2f ns/el"%(t*1e3,t/x.numel()*1e9))
