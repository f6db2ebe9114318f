"""Hugging Face models with tilefuse's fused ops, in one line.

    from transformers import LlamaForCausalLM
    from tilefuse.transformers import apply_tilefuse, revert_tilefuse

    model = LlamaForCausalLM(config)
    apply_tilefuse(model)        # {'rms_norm': 5, 'swiglu': 2, 'cross_entropy': 1, ...}
    ...                          # train as before
    revert_tilefuse(model)

`apply_tilefuse(model)` picks the family from `model.config.model_type`; one
function per family (`apply_tilefuse_to_llama`, `_mistral`, `_qwen2`,
`_qwen3`, `_gemma`, `_gemma2`, `_t5`) takes keyword switches per op. On a
model instance, the modules already built change class in place (to a
subclass of their own class whose forward is fused: parameters, state_dict
and `isinstance` are unchanged); without a model, the family's classes are
patched before construction, so models built afterwards come fused.
Applying twice equals applying once; `revert_tilefuse` undoes either. Each
call returns, and logs once (logger "tilefuse.transformers", INFO), what it
replaced, as a count per kind.

Needs the optional dependency: `pip install tilefuse[transformers]`.
"""

from __future__ import annotations

import copyreg
import dataclasses
import importlib
import logging
import types

try:
    import transformers  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("tilefuse.transformers needs the 'transformers' package: "
                      "pip install tilefuse[transformers]") from error

from . import _fused, _loss

__all__ = [
    "apply_tilefuse", "apply_tilefuse_to_gemma", "apply_tilefuse_to_gemma2",
    "apply_tilefuse_to_llama", "apply_tilefuse_to_mistral", "apply_tilefuse_to_qwen2",
    "apply_tilefuse_to_qwen3", "apply_tilefuse_to_t5", "revert_tilefuse",
]

logger = logging.getLogger("tilefuse.transformers")


@dataclasses.dataclass(frozen=True)
class _Family:
    """Where a model family keeps what tilefuse replaces."""
    model_type: str
    norm: str                       # the RMSNorm class
    norm_forward: types.FunctionType
    mlp: str | None = None          # the gated MLP class
    gate: str | None = None         # its switch: "swiglu" or "geglu"
    causal_lm: str | None = None    # the …ForCausalLM class

    @property
    def modeling(self):
        return importlib.import_module(
            f"transformers.models.{self.model_type}.modeling_{self.model_type}")

    def original(self, name: str) -> type:
        """The family's class `name` as transformers defines it."""
        return _original(getattr(self.modeling, name))


def _llama_like(model_type: str, prefix: str) -> _Family:
    return _Family(model_type, f"{prefix}RMSNorm", _fused.llama_rms_norm, f"{prefix}MLP",
                   "swiglu", f"{prefix}ForCausalLM")


_FAMILIES = {family.model_type: family for family in (
    _llama_like("llama", "Llama"),
    _llama_like("mistral", "Mistral"),
    _llama_like("qwen2", "Qwen2"),
    _llama_like("qwen3", "Qwen3"),
    _Family("gemma", "GemmaRMSNorm", _fused.gemma_rms_norm, "GemmaMLP", "geglu",
            "GemmaForCausalLM"),
    _Family("gemma2", "Gemma2RMSNorm", _fused.gemma_rms_norm, "Gemma2MLP", "geglu",
            "Gemma2ForCausalLM"),
    _Family("t5", "T5LayerNorm", _fused.t5_layer_norm),
)}

# Subclasses with a fused forward, one per class of transformers they replace.
_FUSED: dict[type, type] = {}
# Class-level patches (no model given): (module or class, attribute name,
# original class or forward).
_CLASS_PATCHES: list[tuple[object, str, object]] = []


def _original(cls: type) -> type:
    return vars(cls).get("_tilefuse_original", cls)


def _fused_class(original: type, forward, kind: str) -> type:
    """`original` with `forward` fused: same name, parameters and state."""
    if original not in _FUSED:
        _FUSED[original] = type(original.__name__, (original,), {
            "forward": forward,
            "_tilefuse_original": original,
            "_tilefuse_kind": kind,
            "__module__": original.__module__,
            "__qualname__": original.__qualname__,
            "__doc__": f"{original.__name__} with its forward fused by tilefuse.",
            "__reduce_ex__": _reduce_fused,
        })
    return _FUSED[original]


def _reduce_fused(module, protocol: int):
    """Pickles a fused module (torch.save of a whole model) as where its
    original class is defined, its forward and kind: the fused class and
    the original share a name, which pickle would resolve to whichever the
    modeling module holds (the fused class while the classes are patched)
    and refuse the other."""
    cls = type(module)
    original = cls._tilefuse_original
    state = object.__reduce_ex__(module, max(protocol, 2))[2:]
    return (_new_fused, (original.__module__, original.__qualname__, cls.forward,
                         cls._tilefuse_kind), *state)


def _new_fused(module: str, qualname: str, forward, kind: str):
    """An empty fused module for unpickling (its state follows), fused from
    the original class whether or not the loading process patched it."""
    cls = _fused_class(_defined_original(module, qualname), forward, kind)
    return cls.__new__(cls)


def _reduce_original(module):
    """Pickles an unfused module of a class the classes' patch replaced
    (its name now holds the fused class): by where it is defined."""
    cls = type(module)
    state = object.__reduce_ex__(module, 2)[2:]
    return (_new_original, (cls.__module__, cls.__qualname__), *state)


def _new_original(module: str, qualname: str):
    cls = _defined_original(module, qualname)
    return cls.__new__(cls)


def _defined_original(module: str, qualname: str) -> type:
    """The class `module`.`qualname` names, unfused."""
    current = importlib.import_module(module)
    for name in qualname.split("."):
        current = getattr(current, name)
    return _original(current)


def _replace_modules(model, original: type, forward, kind: str, fits=lambda module: True):
    fused = _fused_class(original, forward, kind)
    replaced = 0
    for module in model.modules():
        if type(module) is original and fits(module):
            module.__class__ = fused
            replaced += 1
    return replaced


def _hook_loss(model, causal_lm: type) -> int:
    if not isinstance(model, causal_lm):
        return 0
    if model.loss_function is _loss.causal_lm_loss:
        return 0
    if "_loss_function" in vars(model):
        logger.warning("tilefuse: %s has its own loss_function; left as it is",
                       type(model).__name__)
        return 0
    model.loss_function = _loss.causal_lm_loss  # transformers' own setter
    return 1


def _fuse_head(model, causal_lm: type) -> int:
    if not isinstance(model, causal_lm) or hasattr(model.forward, "_tilefuse_kind"):
        return 0
    model.forward = _loss.bound_fused_head(model)
    return 1


def _patch_instance(family: _Family, model, switches: dict) -> dict:
    counts = {}
    if switches.get("rms_norm"):
        counts["rms_norm"] = _replace_modules(model, family.original(family.norm),
                                              family.norm_forward, "rms_norm")
    if family.gate and switches.get(family.gate):
        counts[family.gate] = _replace_modules(
            model, family.original(family.mlp), _fused.gated_mlp, family.gate,
            _fused.fusable_gate)
    if family.causal_lm and switches.get("cross_entropy"):
        counts["cross_entropy"] = _hook_loss(model, family.original(family.causal_lm))
    if family.causal_lm and switches.get("linear_cross_entropy"):
        counts["linear_cross_entropy"] = _fuse_head(model, family.original(family.causal_lm))
    return counts


def _patch_classes(family: _Family, switches: dict) -> dict:
    modeling = family.modeling
    counts = {}

    def replace(name: str, forward, kind: str) -> int:
        current = getattr(modeling, name)
        if current is not _original(current):
            return 0
        _CLASS_PATCHES.append((modeling, name, current))
        setattr(modeling, name, _fused_class(current, forward, kind))
        copyreg.pickle(current, _reduce_original)
        return 1

    if switches.get("rms_norm"):
        counts["rms_norm"] = replace(family.norm, family.norm_forward, "rms_norm")
    if family.gate and switches.get(family.gate):
        counts[family.gate] = replace(family.mlp, _fused.gated_mlp, family.gate)
    if family.causal_lm and switches.get("cross_entropy"):
        causal_lm = family.original(family.causal_lm)
        hooked = "_loss_function" in vars(causal_lm)
        if not hooked:
            causal_lm._loss_function = staticmethod(_loss.causal_lm_loss)
        counts["cross_entropy"] = int(not hooked)
    if family.causal_lm and switches.get("linear_cross_entropy"):
        causal_lm = family.original(family.causal_lm)
        fused = hasattr(causal_lm.forward, "_tilefuse_kind")
        if not fused:
            _CLASS_PATCHES.append((causal_lm, "forward", causal_lm.forward))
            causal_lm.forward = _loss.fused_head_forward(causal_lm.forward)
        counts["linear_cross_entropy"] = int(not fused)
    return counts


def _apply(family: _Family, model, switches: dict) -> dict:
    if model is None:
        counts = _patch_classes(family, switches)
        target = f"the {family.model_type} classes"
    else:
        counts = _patch_instance(family, model, switches)
        target = type(model).__name__
    if any(counts.values()):
        logger.info("tilefuse: %s: replaced %s", target,
                    ", ".join(f"{n} {kind}" for kind, n in counts.items() if n))
    return counts


def _family_function(model_type: str, defaults: dict[str, bool]):
    family = _FAMILIES[model_type]

    def apply(model=None, **switches) -> dict:
        unknown = set(switches) - set(defaults)
        if unknown:
            raise TypeError(f"apply_tilefuse_to_{model_type}() got unexpected keyword "
                            f"argument(s) {sorted(unknown)}; it takes {list(defaults)}")
        return _apply(family, model, {**defaults, **switches})

    apply.__name__ = apply.__qualname__ = f"apply_tilefuse_to_{model_type}"
    apply.__doc__ = (
        f"Replaces the {model_type} family's modules in `model` (or, without a model, "
        f"its classes) by fused ones. Keyword switches and their defaults: "
        f"{', '.join(f'{name}={value}' for name, value in defaults.items())}. "
        "linear_cross_entropy: while training with labels the loss comes from the fused "
        "linear cross-entropy and the output has no logits. Returns the count of "
        "replacements per kind.")
    return apply


_LLAMA_SWITCHES = dict(rms_norm=True, swiglu=True, cross_entropy=True,
                       linear_cross_entropy=False)
apply_tilefuse_to_llama = _family_function("llama", _LLAMA_SWITCHES)
apply_tilefuse_to_mistral = _family_function("mistral", _LLAMA_SWITCHES)
apply_tilefuse_to_qwen2 = _family_function("qwen2", _LLAMA_SWITCHES)
apply_tilefuse_to_qwen3 = _family_function("qwen3", _LLAMA_SWITCHES)
_GEMMA_SWITCHES = dict(rms_norm=True, geglu=True, cross_entropy=True,
                       linear_cross_entropy=False)
apply_tilefuse_to_gemma = _family_function("gemma", _GEMMA_SWITCHES)
apply_tilefuse_to_gemma2 = _family_function("gemma2", _GEMMA_SWITCHES)
apply_tilefuse_to_t5 = _family_function("t5", dict(rms_norm=True))
_APPLY = {
    "llama": apply_tilefuse_to_llama, "mistral": apply_tilefuse_to_mistral,
    "qwen2": apply_tilefuse_to_qwen2, "qwen3": apply_tilefuse_to_qwen3,
    "gemma": apply_tilefuse_to_gemma, "gemma2": apply_tilefuse_to_gemma2,
    "t5": apply_tilefuse_to_t5,
}


def _model_type(model_or_class) -> str:
    config = (model_or_class.config_class if isinstance(model_or_class, type)
              else getattr(model_or_class, "config", None))
    model_type = getattr(config, "model_type", None)
    if not isinstance(model_type, str):
        name = getattr(model_or_class, "__name__", type(model_or_class).__name__)
        raise TypeError(f"tilefuse.transformers.apply_tilefuse: expected a transformers "
                        f"model or model class, got {name}")
    return model_type


def apply_tilefuse(model, **switches) -> dict:
    """Patches `model` (an instance, or a model class: then its family's
    classes) with the fused ops of its family; `switches` are that family's
    (see `apply_tilefuse_to_llama` and the others). Raises
    NotImplementedError for a model family tilefuse does not patch."""
    model_type = _model_type(model)
    if model_type not in _APPLY:
        name = model.__name__ if isinstance(model, type) else type(model).__name__
        raise NotImplementedError(
            f"tilefuse.transformers.apply_tilefuse: {name} (model_type '{model_type}') is "
            f"not supported; supported model types: {', '.join(sorted(_APPLY))}")
    return _APPLY[model_type](None if isinstance(model, type) else model, **switches)


def revert_tilefuse(model=None) -> dict:
    """Undoes apply_tilefuse: on `model`, every fused module gets its class
    back and the loss hook is removed; without a model, the classes patched
    before construction are restored. Returns the count per kind."""
    counts: dict[str, int] = {}

    def count(kind: str) -> None:
        counts[kind] = counts.get(kind, 0) + 1

    if model is None:
        while _CLASS_PATCHES:
            owner, name, original = _CLASS_PATCHES.pop()
            count(getattr(owner, name)._tilefuse_kind)
            setattr(owner, name, original)
            copyreg.dispatch_table.pop(original, None)
        for family in _FAMILIES.values():
            if family.causal_lm:
                causal_lm = family.original(family.causal_lm)
                if "_loss_function" in vars(causal_lm):
                    del causal_lm._loss_function
                    count("cross_entropy")
        return counts
    for module in model.modules():
        fused = vars(type(module))
        if "_tilefuse_original" in fused:
            module.__class__ = fused["_tilefuse_original"]
            count(fused["_tilefuse_kind"])
    if vars(model).get("_loss_function") is _loss.causal_lm_loss:
        del model._loss_function
        count("cross_entropy")
    if hasattr(vars(model).get("forward"), "_tilefuse_kind"):
        del model.forward
        count("linear_cross_entropy")
    return counts


