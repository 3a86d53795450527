import pytest
import torch

from model import GPT, GPTConfig

SMALL = dict(block_size=32, vocab_size=128, n_layer=2, n_head=2, n_embd=32)


def test_shapes_and_loss():
    model = GPT(GPTConfig(**SMALL))
    x = torch.randint(0, 128, (3, 16))
    logits, loss = model(x, x)
    assert logits.shape == (3, 16, 128)
    assert loss.ndim == 0 and torch.isfinite(loss)
    logits, loss = model(x)
    assert loss is None


@pytest.mark.parametrize("scaled", [False, True])
def test_causality(scaled):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, scale_attn_by_inverse_layer_idx=scaled)).eval()
    x = torch.randint(0, 128, (2, 20))
    y = x.clone()
    y[:, 12:] = torch.randint(0, 128, (2, 8))  # change only future tokens
    with torch.no_grad():
        a, _ = model(x)
        b, _ = model(y)
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_gpt2_small_parameter_count():
    with torch.device("meta"):
        model = GPT(GPTConfig())  # defaults: GPT-2 small, vocab padded to 50304, no biases
    assert model.num_params() == 124_373_760  # "124.4M" (tied embedding counted once)
    assert model.num_params(non_embedding=True) == 124_373_760 - 1024 * 768


def test_weight_tying():
    model = GPT(GPTConfig(**SMALL))
    assert model.lm_head.weight is model.transformer.wte.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names  # counted (and optimised) once


def test_inverse_layer_idx_scale():
    model = GPT(GPTConfig(**SMALL, scale_attn_by_inverse_layer_idx=True))
    head_dim = 16
    for i, block in enumerate(model.transformer.h):
        effective = block.attn.scale * block.attn.layer_scale.item()
        assert effective == pytest.approx(1 / (head_dim**0.5 * (i + 1)))
    assert "transformer.h.0.attn.layer_scale" not in model.state_dict()  # not persistent


def test_layer_scaled_blocks_share_one_graph_with_attention_inside():
    """The per-layer scale is a graph input: compiled block by block (the Trainer's layout),
    every block runs one graph, SDPA inside it, no graph break (CPU, the eager backend)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = GPT(GPTConfig(**SMALL, scale_attn_by_inverse_layer_idx=True))
    graphs = []

    def backend(gm, example_inputs):  # noqa: ANN001, ANN202
        graphs.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    for block in model.transformer.h:
        block.compile(backend=backend)
    x = torch.randn(2, 10, 32, requires_grad=True)  # as every block's input in training
    for block in model.transformer.h:
        x = block(x)
    torch._dynamo.reset()
    assert len(graphs) == 1 and not counters["graph_break"], (len(graphs), counters["graph_break"])
    assert torch.nn.functional.scaled_dot_product_attention in graphs[0]


def test_scaled_attention_matches_manual():
    torch.manual_seed(0)
    cfg = GPTConfig(**SMALL, scale_attn_by_inverse_layer_idx=True)
    attn = GPT(cfg).transformer.h[1].attn  # layer 1: scores divided by 2 more
    x = torch.randn(2, 10, 32)
    q, k, v = attn.c_attn(x).split(32, dim=2)
    q, k, v = (t.view(2, 10, 2, 16).transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-2, -1)) / (16**0.5 * 2)
    att = att.masked_fill(torch.ones(10, 10).triu(1).bool(), float("-inf")).softmax(-1)
    ref = attn.c_proj((att @ v).transpose(1, 2).reshape(2, 10, 32))
    torch.testing.assert_close(attn(x), ref, rtol=1e-5, atol=1e-5)


def test_flops_per_token():
    model = GPT(GPTConfig(**SMALL))
    n = model.num_params(non_embedding=True)
    assert model.flops_per_token(32) == 6 * n + 12 * 2 * 2 * 16 * 32


def test_bad_config():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="block_size"):
        GPT(GPTConfig(**SMALL))(torch.zeros(1, 33, dtype=torch.long))


def test_generate():
    model = GPT(GPTConfig(**SMALL)).eval()
    out = model.generate(torch.zeros(1, 3, dtype=torch.long), 5, temperature=1.0, top_k=5)
    assert out.shape == (1, 8)


def test_init_std_scales_every_initialised_weight() -> None:
    """``model.init_std`` (the study's width-aware check): the embeddings and Linear weights at
    that std, the residual projections at std / sqrt(2 n_layer); GPT-2's 0.02 by default."""
    import math

    import torch

    from model import ModelConfig, build_model

    torch.manual_seed(0)
    cfg = dict(name="x", block_size=64, vocab_size=257, n_layer=2, n_head=2, n_embd=64)
    for std in (0.02, 0.2):
        m = build_model(ModelConfig(**cfg, init_std=std))
        sd = {n: p.std().item() for n, p in m.named_parameters() if p.ndim == 2}
        assert math.isclose(sd["transformer.wte.weight"], std, rel_tol=0.05)
        assert math.isclose(sd["transformer.h.0.mlp.c_fc.weight"], std, rel_tol=0.05)
        assert math.isclose(sd["transformer.h.0.mlp.c_proj.weight"], std / 2, rel_tol=0.05)
    with pytest.raises(ValueError, match="init_std must be > 0"):
        ModelConfig(**cfg, init_std=0.0)
