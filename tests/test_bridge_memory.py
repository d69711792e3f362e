"""The bridge reaches device memory only through runtime calls (issue 14 item 3).

Every path that reads or writes device memory from the bridge, in every mode, checked
against CPU: copies to the host of contiguous, offset, transposed, expanded and
converted tensors (into contiguous and strided destinations), .item(), printing,
the data-dependent ops that count on the device (nonzero, masked_select, boolean
indexing, unique, bincount, repeat_interleave), torch.save / torch.load, raw storage
copies (resizing a storage, copy-on-write clones) and copies between devices.
"""
import io

import pytest
import torch

import torch_tpu
from tests.conftest import run_python


def test_copies_to_host(mode):
    x = torch.randn(5, 7)
    t = x.to("tpu")
    assert torch.equal(t.cpu(), x)
    assert torch.equal(t.t().cpu(), x.t())
    assert torch.equal(t[:, 2].cpu(), x[:, 2])
    assert torch.equal(t[1:3].cpu(), x[1:3])
    assert torch.equal(t.expand(2, 5, 7).cpu(), x.expand(2, 5, 7))
    assert torch.equal(t.to(torch.float64).cpu(), x.double())
    assert t.t().cpu().stride() == x.t().cpu().stride()  # the layout is kept, as on CPU
    h = torch.empty(7, 5).t()  # a strided destination
    h.copy_(t)
    assert torch.equal(h, x)
    hd = torch.empty(5, 7, dtype=torch.float64)  # another dtype
    hd.copy_(t)
    assert torch.equal(hd, x.double())
    assert t[2, 3].item() == x[2, 3].item()
    assert "device='tpu:0'" in str(t)
    e = torch.empty(0, 3, device="tpu")
    assert e.cpu().shape == (0, 3)


def test_data_dependent_ops_count_on_device(mode):
    x = torch.randn(6, 5)
    t = x.to("tpu")
    m, mc = t > 0, x > 0
    assert torch.equal(t[m].cpu(), x[mc])
    assert torch.equal(torch.nonzero(t).cpu(), torch.nonzero(x))
    assert torch.equal(torch.masked_select(t, m).cpu(), torch.masked_select(x, mc))
    assert torch.equal(torch.unique(t.round()).cpu(), torch.unique(x.round()))
    i = torch.tensor([1, 3, 3, 0, 2])
    assert torch.equal(torch.bincount(i.to("tpu")).cpu(), torch.bincount(i))
    assert torch.equal(torch.repeat_interleave(i.to("tpu")).cpu(), torch.repeat_interleave(i))
    assert torch.nonzero(torch.zeros(0, device="tpu")).shape == (0, 1)
    # a mask that is a broadcast view
    row = torch.tensor([True, False, True, True, False])
    assert torch.equal(t[row.to("tpu").expand(6, 5)].cpu(), x[row.expand(6, 5)])


def test_save_load_and_raw_storage_copies(mode):
    x = torch.randn(3, 4)
    buf = io.BytesIO()
    torch.save(x.to("tpu"), buf)
    buf.seek(0)
    r = torch.load(buf)
    assert r.device.type == "tpu" and torch.equal(r.cpu(), x)
    u = torch.arange(6.0, device="tpu")
    u.resize_(10)  # a bigger storage: the old bytes are copied on the device
    assert torch.equal(u[:6].cpu(), torch.arange(6.0))
    u.untyped_storage().resize_(80)
    assert torch.equal(u[:6].cpu(), torch.arange(6.0))
    a = torch.arange(4.0, device="tpu")
    b = torch._lazy_clone(a)  # copy-on-write: the first write copies the storage
    b.add_(1)
    assert torch.equal(a.cpu(), torch.arange(4.0))
    assert torch.equal(b.cpu(), torch.arange(4.0) + 1)


def test_raw_copies_run_on_the_device():
    with torch_tpu.debug.kernel_profile() as p:
        u = torch.arange(6.0, device="tpu")
        u.untyped_storage().resize_(80)
        a = torch.arange(4.0, device="tpu")
        b = torch._lazy_clone(a)
        b.add_(1)
        b.cpu()
    rows = p.table()
    assert "copy " in rows, rows


def test_copies_between_devices():
    out = run_python("""
import torch
x = torch.randn(4, 6)
a = x.to("tpu:0")
b = a.to("tpu:1")
assert b.device == torch.device("tpu:1")
assert torch.equal(b.cpu(), x)
assert torch.equal(b.t().to("tpu:0").cpu(), x.t())
print("ok")
""", env={"TORCH_TPU_HOST_DEVICES": "2"})
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
