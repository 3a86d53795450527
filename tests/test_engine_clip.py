"""The trainer's global gradient clip folded into the engine (optim/engine/clip.py), on the CPU.

A trainer-style step, ``fold_grad_clip`` then ``step()``, against ``clip_grad_norm_`` then the
same engine step: the norm returned and every parameter and state tensor agree in float64 over
four steps whose clip fires on some and not on others (Triton's interpreter, as
tests/test_engine.py). Skipped without triton.
"""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from test_engine import (  # noqa: E402
    CASES,
    TOL,
    Tiny,
    assert_same,
    clip_like_trainer,
    core,
    make_params,
    set_grads,
    skipped_step_with_folded_clip,
    small_blocks,  # noqa: F401  (the autouse fixture: 16-element blocks)
)
from test_engine import (
    trainer_steps as shared_trainer_steps,
)

import optim  # noqa: E402
from optim import MARS  # noqa: E402
from optim.soap import SoapOptions  # noqa: E402
from trainer.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.engine
MAX_NORM = 3.0  # the gradients' norms are about 0.5, 28, 2.8 and 18: it fires on steps 1 and 3
FOLDED = ["mars-adamw", "mars-adamw-exact-global-amsgrad", "mars-lion", "mars-lion-exact", "lion",
          "muon", "mars-m", "mars-m-exact-global", "ademamix-warmups",
          "adam-before-bias-correction"]  # fmt: skip


def clip(opt, params, fold: bool) -> torch.Tensor:
    return clip_like_trainer(opt, params, fold, MAX_NORM)


def trainer_steps(opt, params, n: int, fold: bool, start: int = 0) -> list:
    return shared_trainer_steps(opt, params, n, fold, MAX_NORM, start)


def assert_norms(a: list, b: list) -> None:
    assert len(a) == len(b)
    fired = [float(n) > MAX_NORM for n in a]
    assert any(fired) and not all(fired)
    for x, y in zip(a, b):
        torch.testing.assert_close(y, x, **TOL)


@pytest.mark.parametrize("name", FOLDED)
def test_folded_clip_equals_clip_grad_norm_then_the_engine_step(name):
    make = CASES[name]
    ref_p, eng_p = make_params(), make_params()
    ref, eng = make(ref_p, "triton"), make(eng_p, "triton")
    set_grads(eng_p, 0)
    assert eng.can_fold_clip() and not eng.can_fold_clip(eng_p[:1])
    assert_norms(trainer_steps(ref, ref_p, 4, False), trainer_steps(eng, eng_p, 4, True))
    assert set(eng.route_counts) == {"engine"} and eng._clip_fold is None
    assert_same(ref_p, ref, eng_p, eng)


def test_schedulefree_folds_the_clip():
    ref_p, eng_p = make_params(), make_params()
    ref, eng = (optim.AdamWScheduleFree(ps, lr=1e-2, weight_decay=0.1, implementation="triton")
                for ps in (ref_p, eng_p))  # fmt: skip
    assert_norms(trainer_steps(ref, ref_p, 4, False), trainer_steps(eng, eng_p, 4, True))
    assert eng.route_counts == {"engine": 4}
    assert_same(ref_p, ref, eng_p, eng)


MERGED = {  # approx MARS with its clip: the fold's pass merged with MARS's norm pass
    "mars-adamw": CASES["mars-adamw"],
    "mars-adamw-global": lambda p, f: MARS(
        p, lr=1e-2, weight_decay=0.1, clip="global", implementation=f
    ),
    "mars-lion": CASES["mars-lion"],
    "mars-adamw-plain-first-step": lambda p, f: MARS(
        p, lr=1e-2, first_step="plain", implementation=f
    ),
}


@pytest.mark.parametrize("name", MERGED)
def test_the_fold_merges_with_the_mars_norm_pass(name, monkeypatch):
    """From the second step (the first makes the reference buffers), one norm pass a step reads
    g and g_ref for both the global clip and MARS's clip (``fold_norm_kernel``, then
    ``merged_finish_kernel`` per bucket: no ``norm_kernel``); the step equals the foreach path
    with ``clip_grad_norm_`` (float64, 1e-12), norms and every state tensor included."""
    from optim.engine import loader

    names, call = [], loader.Go.__call__
    monkeypatch.setattr(
        loader.Go,
        "__call__",
        lambda self, kernel, *a, **kw: (
            names.append(kernel.__name__) if not self.dry else None,
            call(self, kernel, *a, **kw),
        )[1],
    )
    make = MERGED[name]
    ref_p, eng_p = make_params(), make_params()
    ref, eng = make(ref_p, "foreach"), make(eng_p, "triton")
    ref_norms, eng_norms, launched = [], [], []
    for t in range(4):
        ref_norms += trainer_steps(ref, ref_p, 1, False, start=t)
        names.clear()
        eng_norms += trainer_steps(eng, eng_p, 1, True, start=t)
        launched.append(list(names))
    assert_norms(ref_norms, eng_norms)
    assert_same(ref_p, ref, eng_p, eng)
    assert "norm_kernel" in launched[0] and "fold_norm_kernel" not in launched[0]
    for names_t in launched[1:]:
        assert names_t.count("fold_norm_kernel") == 1 and "norm_kernel" not in names_t, names_t
        assert "merged_finish_kernel" in names_t, names_t


def test_new_gradient_buffers_copy_no_merged_rows_again(monkeypatch):
    """Every step's gradients in new buffers (as ``zero_grad(set_to_none=True)`` leaves them):
    each step builds a new fold and new launches, but the plans recur (the plan cache), and the
    device tensor of a launch's rows in the merged sums is kept with its plan, not copied from the
    host each step (a host sync on a GPU: the GPU test of a training step with the device
    decision caught it)."""
    from optim.engine import launch

    seen, merged = [], launch._merged
    monkeypatch.setattr(launch, "_merged", lambda ln: (seen.append(merged(ln)), seen[-1])[1])
    ps = make_params()
    eng = MERGED["mars-adamw"](ps, "triton")
    buffers = [[torch.empty_like(p) for p in ps] for _ in range(2)]  # a GPU allocator's two
    folds, early = set(), set()
    for t in range(8):
        seen.clear()
        set_grads(ps, t)
        for p, buf in zip(ps, buffers[t % 2]):
            p.grad = buf.copy_(p.grad)
        clip_like_trainer(eng, ps, True, MAX_NORM)
        eng.step()
        eng.zero_grad(set_to_none=True)
        folds.add(id(eng.engine_state.fold[3]))
        rows = {id(r) for r in seen if r is not None}
        if t < 4:
            early |= rows
            built = eng.engine_state.cache.built
        else:
            assert rows and rows <= early, "a launch's merged rows were copied again"
    assert len(folds) > 1 and eng.engine_state.cache.built == built  # new folds, the same plans


def test_exact_mode_keeps_the_separate_norm_pass(monkeypatch):
    """Exact mode's fold is the reference store's too: its pass is the plain one."""
    from optim.engine import loader

    names, call = [], loader.Go.__call__
    monkeypatch.setattr(
        loader.Go,
        "__call__",
        lambda self, kernel, *a, **kw: (
            names.append(kernel.__name__),
            call(self, kernel, *a, **kw),
        )[1],
    )
    ps = make_params()
    eng = CASES["mars-adamw-exact-global-amsgrad"](ps, "triton")
    trainer_steps(eng, ps, 3, True)
    assert "fold_norm_kernel" not in names and "norm_kernel" in names


@pytest.mark.parametrize("name", ["mars-adamw", "mars-adamw-exact-global-amsgrad", "mars-m"])
def test_a_skipped_step_with_a_folded_clip_changes_nothing(name):
    """NaN gradients: the fold's norm is NaN (the non-finite check sees it), the step flagged on
    the device writes nothing, and the run goes on as one that never saw that step."""
    make = CASES[name]
    ref_p, eng_p = make_params(), make_params()
    ref, eng = make(ref_p, "triton"), make(eng_p, "triton")
    trainer_steps(ref, ref_p, 2, False), trainer_steps(eng, eng_p, 2, True)
    skipped_step_with_folded_clip(eng, eng_p, MAX_NORM)
    trainer_steps(ref, ref_p, 2, False, start=2), trainer_steps(eng, eng_p, 2, True, start=2)
    assert_same(ref_p, ref, eng_p, eng)


def test_a_bucket_the_engine_hands_back_is_clipped_as_torch_clips():
    """A fold pending when the engine turns off (a kernel that failed to compile): the other
    paths step the gradients scaled as ``clip_grad_norm_`` scales them."""
    ref_p, eng_p = make_params(), make_params()
    ref = MARS(ref_p, weight_decay=0.1, implementation="foreach")
    eng = MARS(eng_p, weight_decay=0.1, implementation="triton")
    set_grads(ref_p, 1), set_grads(eng_p, 1)
    torch.testing.assert_close(clip(eng, eng_p, True), clip(ref, ref_p, False), **TOL)
    eng.engine_state.off = "test"
    ref.step(), eng.step()
    assert [r.name for _, r in eng.last_routes] == ["foreach", "foreach"]
    assert_same(ref_p, ref, eng_p, eng)


def test_what_does_not_fold():
    """SOAP's rotated matrices, torch's AdamW, a parameter the optimizer does not step, and the
    CPU default (no engine) keep ``clip_grad_norm_``; so does a step whose fold was dropped by
    ``zero_grad`` (a step skipped on the host)."""
    ps = make_params()
    set_grads(ps, 1)
    soap = core("soap", SoapOptions(precondition_frequency=2))(ps, "triton")
    assert not soap.can_fold_clip() and soap.fold_grad_clip(MAX_NORM) is None
    assert "does not take the engine" in soap.clip_fold_off_reason
    assert not hasattr(torch.optim.AdamW(ps), "fold_grad_clip")
    assert MARS(ps).fold_grad_clip(MAX_NORM) is None  # auto on a CPU: foreach
    some = MARS(ps[:2], implementation="triton")
    assert some.fold_grad_clip(MAX_NORM, ps) is None
    assert "not this optimizer's" in some.clip_fold_off_reason
    assert some.fold_grad_clip(MAX_NORM, ps[:1]) is None  # it steps a gradient not measured
    assert some.fold_grad_clip(MAX_NORM, ps[:2]) is not None and some._clip_fold is not None
    some.zero_grad()
    assert some._clip_fold is None


def test_the_trainer_folds_where_the_optimizer_can():
    """``Trainer.clip_grads``: the engine's fold (gradients unscaled, the same norm), else
    ``clip_grad_norm_`` (gradients scaled in place)."""
    models = [Tiny().double() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    for m in models:
        for p in m.parameters():
            gen = torch.Generator().manual_seed(p.numel())
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype) * 3

    def trainer(model, opt):
        cfg = SimpleNamespace(grad_clip=1.0)
        return SimpleNamespace(cfg=cfg, optimizer=opt, raw_model=model)

    cfg = optim.get_spec("mars-adamw").config_cls(implementation="triton")
    folded = optim.build_optimizer(models[0], cfg)
    raw = [p.grad.clone() for p in models[0].parameters()]
    norm = Trainer.clip_grads(trainer(models[0], folded))
    assert folded._clip_fold is not None
    assert all(torch.equal(p.grad, g) for p, g in zip(models[0].parameters(), raw))
    adamw = torch.optim.AdamW(models[1].parameters())
    torch.testing.assert_close(norm, Trainer.clip_grads(trainer(models[1], adamw)), **TOL)
    assert not all(torch.equal(p.grad, g) for p, g in zip(models[1].parameters(), raw))


def test_a_training_run_with_the_fold_equals_one_with_clip_grad_norm_(tmp_path, sotu_dir,
                                                                      monkeypatch):  # fmt: skip
    """The Trainer on the engine (exact MARS-AdamW: the reference pass folds too, the device
    decision): three steps, the second poisoned and skipped, the clip firing; the same weights,
    state and norms as the same run through ``clip_grad_norm_`` (float32: to its accuracy)."""
    import trainer.trainer as trainer_mod
    from helpers import fast_config
    from optim.engine import launch
    from runtime.distributed import destroy, init_distributed

    monkeypatch.setitem(launch.BLOCKS, "cpu", 1 << 16)  # a few programs per launch: fast
    real = trainer_mod.Trainer.clip_grads

    def poisoning_clip(self):
        if self.state.step + 1 == 2:
            next(p for p in self.raw_model.parameters()).grad.view(-1)[0] = float("nan")
        return real(self)

    monkeypatch.setattr(trainer_mod.Trainer, "clip_grads", poisoning_clip)
    runs = []
    for fold in (True, False):
        typed, _ = fast_config(tmp_path / str(fold), sotu_dir, "max_steps=3", "grad_clip=0.1",
                               "optimizer=mars-adamw", "optimizer.mode=exact",
                               "nonfinite.decision=device",
                               "optimizer.implementation=triton")  # fmt: skip
        trainer = trainer_mod.Trainer(typed, init_distributed("cpu"), out_dir=tmp_path)
        if not fold:
            monkeypatch.setattr(trainer.optimizer, "fold_grad_clip", lambda *a: None)
        norms = [trainer.train_step()[1] for _ in range(3)]
        trainer.guard.resolve()
        assert trainer.state.skipped_steps == 1 and norms[1].isnan()
        assert set(trainer.optimizer.route_counts) == {"engine"}
        if fold:
            assert trainer.optimizer.clip_fold_off_reason is None
        runs.append((norms, trainer))
        destroy()
    (norms, a), (ref_norms, b) = runs
    # torch's float32 norm on a CPU sums the 1.6M squares of the head naively: 1e-5 off the
    # float64 norm here, the fold's per-block sums 2e-8; the clip factors differ by as much
    tol = dict(rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(norms, ref_norms, **tol, equal_nan=True)
    assert all(float(n) > 0.1 for n in ref_norms if not n.isnan())
    for x, y in zip(a.raw_model.parameters(), b.raw_model.parameters()):
        torch.testing.assert_close(x, y, **tol)
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    torch.testing.assert_close({i: {k: v for k, v in s.items() if k != "previous_grad"}
                                for i, s in sa.items()},
                               {i: {k: v for k, v in s.items() if k != "previous_grad"}
                                for i, s in sb.items()}, **tol)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["mars-adamw", "mars-lion-exact", "muon"])
def test_folded_clip_on_cuda(name, monkeypatch):
    """The compiled kernels on the GPU, float32: the fold against ``clip_grad_norm_`` and the
    same engine step, whole blocks and tails, to float32's rounding."""
    from optim.engine import launch

    monkeypatch.setitem(launch.BLOCKS, "cuda", 1024)
    shapes = [(64, 130), (33, 70), (4097,)]

    def cuda_params():
        return [torch.nn.Parameter(p.detach().float().cuda()) for p in make_params(shapes)]

    ref_p, eng_p = cuda_params(), cuda_params()
    ref, eng = CASES[name](ref_p, "triton"), CASES[name](eng_p, "triton")
    norms = trainer_steps(ref, ref_p, 4, False), trainer_steps(eng, eng_p, 4, True)
    tol = dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norms[1], norms[0], **tol)
    assert set(eng.route_counts) == {"engine"}
    assert_same(ref_p, ref, eng_p, eng, tol=dict(rtol=1e-4, atol=1e-5))


def test_the_benchmarks_byte_count_follows_the_merge():
    """bench.optim_fused's bytes: a corrected tensor of MARS-AdamW moves 11 tensors a parameter
    with the fold merged (44 bytes in float32; 12 before the merge, the first step), its 1-D
    AdamW tensors 7 + the fold's read of g."""
    from bench.optim_fused import moved_bytes, passes

    ps = make_params()
    opt = CASES["mars-adamw"](ps, "triton")
    mats = sum(p.numel() for p in ps if p.ndim == 2) * 8  # float64
    rest = sum(p.numel() for p in ps if p.ndim != 2) * 8
    trainer_steps(opt, ps, 1, True)
    assert moved_bytes(opt, "mars-adamw", "fold") == 12 * mats + 8 * rest  # state made: apart
    trainer_steps(opt, ps, 1, True, start=1)
    assert moved_bytes(opt, "mars-adamw", "fold") == 11 * mats + 8 * rest  # merged
    assert passes("mars-adamw", "fold", merged=True) == 11
