import torch, time
import torch.nn.functional as F
torch.set_num_threads(1)
B,H,L,D=2,9,1800,64
q=torch.randn(B,H,L,D,requires_grad=True); k=torch.randn(B,H,L,D,requires_grad=True); v=torch.randn(B,H,L,D,requires_grad=True)
mask=torch.ones(L,L,dtype=torch.bool).tril()[None,None].expand(B,1,L,L).clone()
mask[1,:,:,1500:]=False
def run(**kw):
    c=time.process_time()
    o=F.scaled_dot_product_attention(q,k,v,**kw); o.sum().backward()
    return time.process_time()-c
for name,kw in [("causal",dict(is_causal=True)),("boolmask",dict(attn_mask=mask)),("floatmask",dict(attn_mask=torch.zeros(B,1,L,L).masked_fill(~mask,-1e9)))]:
    ts=[run(**kw) for _ in range(2)]
    print(name, ["%.2f"%t for t in ts])
with torch.profiler.profile() as p:
    run(attn_mask=mask)
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
