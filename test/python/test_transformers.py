"""tilefuse.transformers: Hugging Face models patched in one line, against
the same models unpatched (tiny random-init configs: no download)."""

import copy
import logging

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.loss.loss_utils import ForCausalLMLoss  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.t5.modeling_t5 import T5LayerNorm  # noqa: E402

import tilefuse.transformers as TT  # noqa: E402
from tilefuse import functional as TF  # noqa: E402
from tilefuse.transformers._loss import causal_lm_loss  # noqa: E402

VOCAB, SEQ = 128, 12
SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=2 * SEQ)
# family: (config class, model class, its extra config, counts apply_tilefuse reports)
CAUSAL_LMS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {},
              {"rms_norm": 5, "swiglu": 2, "cross_entropy": 1}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {},
                {"rms_norm": 5, "swiglu": 2, "cross_entropy": 1}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {},
              {"rms_norm": 5, "swiglu": 2, "cross_entropy": 1}),
    # Qwen3 also normalizes each head's queries and keys.
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {},
              {"rms_norm": 9, "swiglu": 2, "cross_entropy": 1}),
    # Gemma: (1 + weight) norms and a tanh-GELU gate.
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {},
              {"rms_norm": 5, "geglu": 2, "cross_entropy": 1}),
    # Gemma 2: four norms per layer, soft-capped attention and final logits.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(query_pre_attn_scalar=16, final_logit_softcapping=3.0,
                    attn_logit_softcapping=50.0, sliding_window=8),
               {"rms_norm": 9, "geglu": 2, "cross_entropy": 1}),
}
T5_SIZES = dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                feed_forward_proj="gated-gelu", decoder_start_token_id=0, pad_token_id=0,
                dropout_rate=0.0)
# T5: per encoder block 2 norms, per decoder block 3, and one final norm each.
T5_COUNTS = {"rms_norm": 2 * 2 + 1 + 2 * 3 + 1}
FAMILIES = [*CAUSAL_LMS, "t5"]
needs_linear_cross_entropy = pytest.mark.skipif(
    not hasattr(TF, "linear_cross_entropy"),
    reason="tilefuse.functional.linear_cross_entropy is not built yet")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models step fastest on one thread (and OpenMP threads spinning
    at barriers made a step 10-100x slower on a loaded 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_model(family: str):
    torch.manual_seed(0)
    if family == "t5":
        config = transformers.T5Config(**T5_SIZES)
        return transformers.T5ForConditionalGeneration(config)
    config_class, model_class, extra, _ = CAUSAL_LMS[family]
    config = getattr(transformers, config_class)(**SIZES, **extra)
    return getattr(transformers, model_class)(config)


def batch(family: str):
    """A fixed synthetic batch; the labels have padding (ignore_index)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=generator)
    labels = ids.clone()
    labels[1, :3] = -100
    if family == "t5":
        return dict(input_ids=ids, labels=labels.roll(1, dims=1))
    return dict(input_ids=ids, labels=labels)


def expected_counts(family: str) -> dict:
    return T5_COUNTS if family == "t5" else CAUSAL_LMS[family][3]


def module_types(model) -> list[type]:
    return [type(module) for module in model.modules()]


@pytest.mark.parametrize("family", FAMILIES)
def test_patch_is_idempotent_reversible_and_counted(family, caplog):
    model = make_model(family)
    plain = copy.deepcopy(model)
    inputs = batch(family)
    with caplog.at_level(logging.INFO, logger="tilefuse.transformers"):
        counts = TT.apply_tilefuse(model)
        assert TT.apply_tilefuse(model) == dict.fromkeys(counts, 0)
    assert counts == expected_counts(family)
    # Logged once, by the call that replaced something.
    (record,) = caplog.records
    assert type(model).__name__ in record.getMessage()
    assert all(f"{n} {kind}" in record.getMessage() for kind, n in counts.items())

    # Parameters, state_dict and isinstance are kept; only forwards change.
    assert model.state_dict().keys() == plain.state_dict().keys()
    for (name, value), expected in zip(model.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(value, expected), name
    for module, original in zip(model.modules(), plain.modules()):
        assert isinstance(module, type(original))
    fused = sum(type(m) is not type(o) for m, o in zip(model.modules(), plain.modules()))
    assert fused == sum(n for kind, n in counts.items() if kind != "cross_entropy")
    if "cross_entropy" in counts:
        assert model.loss_function is causal_lm_loss

    patched_out, plain_out = model(**inputs), plain(**inputs)
    torch.testing.assert_close(patched_out.logits, plain_out.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(patched_out.loss, plain_out.loss, atol=1e-5, rtol=1e-5)

    assert TT.revert_tilefuse(model) == counts
    assert module_types(model) == module_types(plain)
    assert model.loss_function is plain.loss_function
    reverted_out = model(**inputs)
    assert torch.equal(reverted_out.logits, plain_out.logits)
    assert torch.equal(reverted_out.loss, plain_out.loss)


@pytest.mark.parametrize("family", ["llama", "gemma2", "t5"])
def test_torch_save_of_a_patched_model_loads_patched(family):
    """torch.save of a whole patched model failed (the fused classes carry
    their originals' names, which pickle resolves to the originals); it
    loads with the same fused modules and head, the same outputs, and
    reverts as the model it was saved from."""
    import io

    model = make_model(family)
    switches = {} if family == "t5" else {"linear_cross_entropy": True}
    counts = TT.apply_tilefuse(model, **switches)
    saved = io.BytesIO()
    torch.save(model, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    assert module_types(loaded) == module_types(model)
    inputs = batch(family)
    for mode in ("train", "eval"):
        getattr(model, mode)(), getattr(loaded, mode)()
        out, expected = loaded(**inputs), model(**inputs)
        assert torch.equal(out.loss, expected.loss)
        if family != "t5":
            assert (out.logits is None) == (expected.logits is None) == (mode == "train")
    assert TT.revert_tilefuse(loaded) == counts
    assert module_types(loaded) == module_types(make_model(family))
    assert "forward" not in vars(loaded)


def test_torch_save_while_the_classes_are_patched():
    """With the classes patched (their names hold the fused classes), models
    built before, fused per instance or built after all save and load with
    their own modules (it raised: pickle resolved the names to the fused
    classes); a fused model loaded into a patched process is fused once and
    reverts (it was fused twice, and stayed so)."""
    import io

    def round_trip(model):
        saved = io.BytesIO()
        torch.save(model, saved)
        saved.seek(0)
        return torch.load(saved, weights_only=False)

    plain, per_instance = make_model("llama"), make_model("llama")
    TT.apply_tilefuse(per_instance, linear_cross_entropy=True)
    saved_fused = io.BytesIO()
    torch.save(per_instance, saved_fused)
    TT.apply_tilefuse_to_llama(linear_cross_entropy=True)
    try:
        built_fused = make_model("llama")
        inputs = batch("llama")
        for model in (plain, per_instance, built_fused):
            loaded = round_trip(model)
            assert module_types(loaded) == module_types(model)
            assert torch.equal(loaded(**inputs).loss, model(**inputs).loss)
        saved_fused.seek(0)
        loaded = torch.load(saved_fused, weights_only=False)
        assert module_types(loaded) == module_types(per_instance)
        loaded.train()
        assert loaded(**inputs).logits is None  # its own fused head
        assert TT.revert_tilefuse(loaded)["swiglu"] == 2
    finally:
        TT.revert_tilefuse()
    assert module_types(loaded) == module_types(plain)
    assert module_types(round_trip(plain)) == module_types(plain)


def test_switches_choose_what_is_replaced():
    model = make_model("llama")
    assert TT.apply_tilefuse_to_llama(model, rms_norm=False, cross_entropy=False) == {"swiglu": 2}
    assert type(model.model.norm) is modeling_llama.LlamaRMSNorm
    assert TT.apply_tilefuse_to_llama(model) == {"rms_norm": 5, "swiglu": 0, "cross_entropy": 1}
    with pytest.raises(TypeError, match=r"apply_tilefuse_to_llama\(\).*'geglu'"):
        TT.apply_tilefuse_to_llama(model, geglu=True)


def test_a_family_function_leaves_other_models_untouched():
    model = make_model("llama")
    types = module_types(model)
    assert TT.apply_tilefuse_to_t5(model) == {"rms_norm": 0}
    assert TT.apply_tilefuse_to_qwen2(model) == {"rms_norm": 0, "swiglu": 0, "cross_entropy": 0}
    assert module_types(model) == types


def test_classes_patched_before_construction():
    original_norm = modeling_llama.LlamaRMSNorm
    assert TT.apply_tilefuse_to_llama() == {"rms_norm": 1, "swiglu": 1, "cross_entropy": 1}
    try:
        assert TT.apply_tilefuse_to_llama() == {"rms_norm": 0, "swiglu": 0, "cross_entropy": 0}
        model = make_model("llama")
        assert isinstance(model.model.norm, original_norm)
        assert type(model.model.norm) is not original_norm
        assert model.loss_function is causal_lm_loss
        # Nothing left to do on a model built fused.
        assert not any(TT.apply_tilefuse(model).values())
        plain_norm = original_norm(64)
        assert type(plain_norm) is original_norm
    finally:
        assert TT.revert_tilefuse() == {"rms_norm": 1, "swiglu": 1, "cross_entropy": 1}
    assert modeling_llama.LlamaRMSNorm is original_norm
    assert type(make_model("llama").model.norm) is original_norm
    assert TT.revert_tilefuse() == {}


def test_unsupported_model_raises_naming_its_class():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2)
    with pytest.raises(NotImplementedError, match=r"GPT2LMHeadModel \(model_type 'gpt2'\) "
                                                  r"is not supported.*llama"):
        TT.apply_tilefuse(transformers.GPT2LMHeadModel(config))
    with pytest.raises(NotImplementedError, match="GPT2LMHeadModel"):
        TT.apply_tilefuse(transformers.GPT2LMHeadModel)
    with pytest.raises(TypeError, match="expected a transformers model.*Linear"):
        TT.apply_tilefuse(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("num_items", [None, 7, torch.tensor(7)], ids=["mean", "int", "tensor"])
def test_loss_hook_matches_for_causal_lm_loss(num_items):
    """The shift, ignore_index (padding, a custom index) and the
    num_items_in_batch normalization of gradient accumulation (ForCausalLMLoss
    computes in float32)."""
    logits = torch.randn(2, 9, 37)
    labels = torch.randint(0, 37, (2, 9))
    labels[0, :4] = -100
    cases = [(labels, {}), (labels.masked_fill(labels == -100, 5), {"ignore_index": 5}),
             (labels, {"shift_labels": labels.roll(-1, 1)})]
    for labels, kwargs in cases:
        ours, theirs = (logits.clone().requires_grad_() for _ in range(2))
        loss = causal_lm_loss(ours, labels, 37, num_items_in_batch=num_items, **kwargs)
        expected = ForCausalLMLoss(theirs, labels, 37, num_items_in_batch=num_items, **kwargs)
        torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)
        loss.backward()
        expected.backward()
        torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-7, rtol=1e-5)
    # 16-bit logits: a float32 loss, as transformers' upcast gives it.
    half = logits.bfloat16()
    loss = causal_lm_loss(half, labels, 37, num_items_in_batch=num_items)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(
        loss, ForCausalLMLoss(half, labels, 37, num_items_in_batch=num_items),
        atol=1e-6, rtol=1e-6)


def test_loss_hook_in_the_model_with_num_items_in_batch():
    model = make_model("llama")
    plain = copy.deepcopy(model)
    TT.apply_tilefuse(model, rms_norm=False, swiglu=False)
    inputs = batch("llama")
    for extra in ({}, {"num_items_in_batch": torch.tensor(40)}):
        loss = model(**inputs, **extra).loss
        expected = plain(**inputs, **extra).loss
        torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)
        loss.backward()
        expected.backward()
        torch.testing.assert_close(model.lm_head.weight.grad, plain.lm_head.weight.grad,
                                   atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("input_dtype", ["weight", torch.float32])
def test_t5_layer_norm_in_half_precision(weight_dtype, input_dtype):
    """T5LayerNorm's rules: the variance in float32, the output in a 16-bit
    weight's dtype. The fused forward equals the eager module's bit for bit;
    gradients are checked against float64 next to the eager module's (the
    fused weight gradient sums the rows in float32, rounding once)."""
    input_dtype = weight_dtype if input_dtype == "weight" else input_dtype
    eager = T5LayerNorm(64, eps=1e-6)
    with torch.no_grad():
        eager.weight.normal_()
    reference = copy.deepcopy(eager).double()
    eager.to(weight_dtype)
    fused = copy.deepcopy(eager)
    assert TT.apply_tilefuse_to_t5(fused) == {"rms_norm": 1}
    assert TT.apply_tilefuse_to_t5(fused) == {"rms_norm": 0}
    with torch.no_grad():
        reference.weight.copy_(eager.weight)
    x = (torch.randn(4, 50, 64) * 4).to(input_dtype)
    grad = torch.randn(4, 50, 64).to(weight_dtype)
    outputs, input_grads = [], []
    for module in (eager, fused, reference):
        xi = x.to(torch.float64 if module is reference else input_dtype).clone().requires_grad_()
        out = module(xi)
        out.backward(grad.to(out.dtype))
        outputs.append(out)
        input_grads.append(xi.grad)
    (eager_out, fused_out, exact) = outputs
    assert fused_out.dtype == eager_out.dtype == weight_dtype
    assert torch.equal(fused_out, eager_out)
    for name, (e, f, r) in {"input": input_grads,
                            "weight": [m.weight.grad for m in (eager, fused, reference)]}.items():
        eager_error = (e.double() - r).abs().max().item()
        fused_error = (f.double() - r).abs().max().item()
        # Within a rounding of the eager module's error (summing rows in 16
        # bits instead, the weight's gradient was off by ~4x that).
        rounding = torch.finfo(weight_dtype).eps * r.abs().max().item()
        assert fused_error <= eager_error + rounding, (name, fused_error, eager_error)


def test_t5_patch_on_an_f32_model_and_its_encoder():
    model = make_model("t5")
    encoder = copy.deepcopy(model.encoder)
    plain = copy.deepcopy(encoder)
    assert TT.apply_tilefuse_to_t5(encoder) == {"rms_norm": 2 * 2 + 1}
    ids = batch("t5")["input_ids"]
    torch.testing.assert_close(encoder(input_ids=ids).last_hidden_state,
                               plain(input_ids=ids).last_hidden_state, atol=1e-5, rtol=1e-5)


def train(model, inputs: dict, steps: int, autocast: bool,
          optimizer_class=torch.optim.AdamW) -> list[float]:
    optimizer = optimizer_class(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


CONVERGENCE_STEPS = 30


# Gemma 2's linear cross-entropy is compared in f32 only: under bf16 autocast
# eager rounds the soft-capped logits to bf16 three times (divide, tanh,
# multiply), the fused kernel caps them in f32; they drifted 4.4e-3 apart.
CONVERGENCE = [
    *((family, precision) for family in FAMILIES for precision in ("f32", "bf16")),
    *(pytest.param(family, precision, marks=needs_linear_cross_entropy)
      for family, precision in [("llama-linear", "f32"), ("llama-linear", "bf16"),
                                ("gemma2-linear", "f32")]),
]


@pytest.mark.parametrize("family, precision", CONVERGENCE)
def test_convergence(family, precision):
    """Liger's convergence test: a tiny random-init model trained on a fixed
    batch with and without patching, losses compared step by step
    ("-linear": the loss from the fused linear cross-entropy)."""
    family, _, linear = family.partition("-")
    model = make_model(family)
    patched = copy.deepcopy(model)
    TT.apply_tilefuse(patched, **({"linear_cross_entropy": True} if linear else {}))
    inputs, autocast = batch(family), precision == "bf16"
    exact = copy.deepcopy(model).double() if autocast else None
    expected = train(model, inputs, CONVERGENCE_STEPS, autocast)
    losses = train(patched, inputs, CONVERGENCE_STEPS, autocast)
    assert expected[-1] < expected[0] - 0.1  # it learns
    if not autocast:
        differences = [abs(a - b) for a, b in zip(losses, expected)]
        assert max(differences) <= 1e-4, differences
        return
    # Under bf16 both runs drift from the exact trajectory, and 30 steps
    # amplify each rounding chaotically (eager's drift alone varies 1-3e-3
    # with the CPU's bf16 kernels), so both are measured against float64:
    # the patched run may drift at most 3x as far as eager does. That still
    # fails when the norm weights get no gradient; subtler errors (a permuted
    # norm-weight gradient) are the f32 cases' to catch, and they do.
    reference = train(exact, inputs, CONVERGENCE_STEPS, autocast=False)
    eager_drift = max(abs(a - b) for a, b in zip(expected, reference))
    drift = [abs(a - b) for a, b in zip(losses, reference)]
    assert max(drift) <= 3 * eager_drift, (eager_drift, drift)


def test_patched_model_compiles_without_graph_breaks():
    """torch.compile(fullgraph=True) of a patched model's forward and
    backward: the fused ops (built-ins and the DSL's T5 norm) stay in the
    graph. aot_eager traces what inductor would get, without code generation."""
    model = make_model("llama")
    TT.apply_tilefuse(model)
    inputs = batch("llama")
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    loss = compiled(**inputs).loss
    loss.backward()
    expected = model(**inputs).loss
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)

    norm = T5LayerNorm(64).to(torch.bfloat16)
    TT.apply_tilefuse_to_t5(norm)
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16, requires_grad=True)
    out = torch.compile(norm, fullgraph=True, backend="aot_eager")(x)
    out.sum().backward()
    assert torch.equal(out, norm(x))


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_convergence_with_tilefuse_adamw(precision):
    """The patched model trained by tilefuse.optim.AdamW against the
    unpatched one trained by torch.optim.AdamW."""
    optim = pytest.importorskip("tilefuse.optim", reason="tilefuse.optim is not built yet")
    model = make_model("llama")
    patched = copy.deepcopy(model)
    TT.apply_tilefuse(patched)
    inputs, autocast = batch("llama"), precision == "bf16"
    expected = train(model, inputs, CONVERGENCE_STEPS, autocast)
    losses = train(patched, inputs, CONVERGENCE_STEPS, autocast, optim.AdamW)
    tolerance = 1e-4 if precision == "f32" else 3e-3
    assert max(abs(a - b) for a, b in zip(losses, expected)) <= tolerance


@needs_linear_cross_entropy
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_linear_cross_entropy_never_builds_logits(family):
    """While training with labels the loss comes from the fused linear
    cross-entropy (Gemma 2's soft-capping inside it) and the output has no
    logits; in eval mode the model runs as before."""
    model = make_model(family)
    plain = copy.deepcopy(model)
    gate = "geglu" if family.startswith("gemma") else "swiglu"
    assert TT.apply_tilefuse(model, rms_norm=False, cross_entropy=False, **{gate: False},
                             linear_cross_entropy=True) == {"linear_cross_entropy": 1}
    assert TT.apply_tilefuse(model, linear_cross_entropy=True)["linear_cross_entropy"] == 0
    inputs = batch(family)
    for extra in ({}, {"num_items_in_batch": torch.tensor(17)}):
        out, expected = model(**inputs, **extra), plain(**inputs, **extra)
        assert out.logits is None
        torch.testing.assert_close(out.loss, expected.loss, atol=1e-5, rtol=1e-5)
        out.loss.backward()
        expected.loss.backward()
        for name, parameter in plain.named_parameters():
            torch.testing.assert_close(model.get_parameter(name).grad, parameter.grad,
                                       atol=1e-6, rtol=1e-4, msg=name)
        model.zero_grad()
        plain.zero_grad()
    loss = model(**inputs, return_dict=False)[0]
    torch.testing.assert_close(loss, plain(**inputs).loss, atol=1e-5, rtol=1e-5)
    model.eval()
    torch.testing.assert_close(model(**inputs).logits, plain.eval()(**inputs).logits)
    assert TT.revert_tilefuse(model)["linear_cross_entropy"] == 1
    assert "forward" not in vars(model)
