import sys, time, torch, pathlib, statistics
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
import pointcloud_unet as P
import sparsejit
from sparsejit.families.point_conv import ops as PO
torch.set_num_threads(int(sys.argv[1]))
pts = P.load_scan("000000", 0.05)
coords, feats, shape = P.voxels(pts, 0.05)
coords = coords.int(); n = len(coords)
plan, _ = PO.conv_plan(coords, shape, 1, "subm", 3)
res = []
for c in [int(a) for a in sys.argv[2:]]:
    x = torch.randn(n, c); w = torch.randn(27, c, c) * 0.1; gy = torch.randn(n, c)
    f = lambda: torch.ops.sparsejit.sparse_conv(x, w, None, plan, n, False, 2, False)
    b = lambda: torch.ops.sparsejit.sparse_conv_backward(x, w, gy, plan, False, 2, True, False)
    for fn, name in ((f, "fwd"), (b, "dX")):
        for _ in range(5): fn()
        ts = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(40): fn()
            ts.append((time.perf_counter() - t) / 40 * 1e3)
        res.append(f"C={c} {name} {min(ts):.3f}/{statistics.median(ts):.3f}")
print(sparsejit.__file__.split("/")[2], sys.argv[1], "thr:", "  ".join(res))
