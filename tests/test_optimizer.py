import pytest
import torch
from g2rpo.common.config.algorithm import OptimConfig
from g2rpo.learner.optimizer import adamw, adamw_kernel


def test_auto_is_fused_on_cuda_and_the_loop_elsewhere():
    auto = OptimConfig()
    assert adamw_kernel(auto, "cuda") == "fused"
    assert adamw_kernel(auto, "cuda:1") == "fused"
    assert adamw_kernel(auto, "cpu") == "for_loop"
    assert adamw_kernel(OptimConfig(implementation="foreach"), "cuda") == "foreach"


def test_bad_implementation_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="implementation"):
        OptimConfig(implementation="apex")


@pytest.mark.parametrize("kernel", ["fused", "foreach", "for_loop"])
def test_every_kernel_takes_the_same_adamw_steps(kernel):
    """Three steps of each kernel against AdamW written out (Loshchilov & Hutter, alg. 2):
    θ ← θ(1 − lr·λ) − lr·m̂/(√v̂ + ε)."""
    o = OptimConfig(lr=1e-2, weight_decay=0.1, implementation=kernel)
    torch.manual_seed(0)
    theta = torch.randn(5, 3)
    grads = [torch.randn(5, 3) for _ in range(3)]
    p = torch.nn.Parameter(theta.clone())
    opt = adamw([p], o, "cpu")
    assert bool(opt.defaults["fused"]) == (kernel == "fused")
    assert bool(opt.defaults["foreach"]) == (kernel == "foreach")
    m, v, ref = torch.zeros_like(theta), torch.zeros_like(theta), theta.clone()
    (b1, b2), lr, wd, eps = o.betas, o.lr, o.weight_decay, o.eps
    for n, g in enumerate(grads, 1):
        p.grad = g.clone()
        opt.step()
        ref = ref * (1 - lr * wd)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        ref = ref - lr * (m / (1 - b1**n)) / ((v / (1 - b2**n)).sqrt() + eps)
    assert torch.allclose(p.detach(), ref, atol=1e-6)


def test_a_checkpoint_does_not_carry_its_kernel_into_a_resumed_learner(tmp_path):
    """Param groups saved by one kernel (torch's defaults before optim.implementation
    existed, or another device's) load with the flags of the config that resumes."""
    from pathlib import Path

    from g2rpo.common.config.loading import load_config
    from g2rpo.learner.trainer import LearnerCore

    world = Path(__file__).resolve().parents[1] / "assets" / "shapes-world" / "pipeline"
    small = [f"model.pretrained={world}", "rewards=[{name: shapes_clip}]"]
    saver = LearnerCore(load_config(None, [*small, "optim.implementation=foreach"]))
    assert saver.optimizer.param_groups[0]["foreach"] is True
    saver.save(str(tmp_path / "ckpt.pt"))
    resumed = LearnerCore(load_config(None, small))  # auto: the loop on the CPU
    resumed.load(str(tmp_path / "ckpt.pt"))
    for group in resumed.optimizer.param_groups:
        assert group["foreach"] is False and group["fused"] is False
