import os, sys
from torch.utils.cpp_extension import load
from esft.kernels import CFLAGS, LDFLAGS
def loadk(src):
    name = "x_" + os.path.basename(src).replace(".cpp", "")
    d = f"/tmp/attn/build_{name}"; os.makedirs(d, exist_ok=True)
    return load(name=name, sources=[src], extra_cflags=CFLAGS, extra_ldflags=LDFLAGS, build_directory=d, verbose=False)
