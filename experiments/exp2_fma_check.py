"""GPU check of ``flashbook.ladder.fmha.exp2_fma`` alone: 2^x on the FMA pipes against torch.exp2."""
import cuda.tile as ct
import torch

from flashbook.ladder.fmha import exp2_fma


@ct.kernel
def exp2_kernel(X, Y, TILE: ct.Constant[int]):
    x = ct.load(X, index=(ct.bid(0),), shape=(TILE,))
    ct.store(Y, index=(ct.bid(0),), tile=exp2_fma(x))


x = torch.cat([torch.linspace(-125.9, 0, 1 << 16, device="cuda"),
               torch.tensor([-float("inf"), -127.0, -126.5, -3.0, -1.0, 0.0] * 1024,
                            device="cuda")[: 1 << 12]]).float()
y = torch.full_like(x, float("nan"))
ct.launch(torch.cuda.current_stream(), (x.numel() // 1024,), exp2_kernel, (x, y, 1024))
torch.cuda.synchronize()
ref = torch.exp2(x.double())
ok = x > -126
rel = ((y.double() - ref).abs() / ref)[ok]
print(f"exp2_fma: max rel err {rel.max().item():.2e} over x in (-126, 0]; nan {y.isnan().sum().item()};"
      f" at -inf, -127, -126.5, -3, -1, 0: {y[1 << 16:(1 << 16) + 6].tolist()}")
