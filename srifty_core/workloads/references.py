"""Which network to profile, plan and train: a zoo name, your factory, or a Hugging Face
architecture built from its config.

A model reference (``--model``, a request's ``model``, a plan's ``model``) is one of:

- a zoo name (``resnet18``, ``bert_base``, ...: ``srifty_core.workloads.zoo``);
- ``package.module:factory``: an importable module and a callable in it;
- ``path/to/file.py:factory``: a Python file (relative to the working directory) and a
  callable in it;
- ``hf:NAME``: a ``transformers`` architecture built from a config with random weights
  (nothing is downloaded). ``NAME`` is a config shipped in ``srifty_core/shipped/hf/``
  (``hf:bert-base-uncased``, ``hf:gpt2``, ...), a ``config.json`` file, or a folder that
  holds one. Size ``full`` builds the config as it is; ``small`` and ``tiny`` scale it
  down as the zoo's BERT sizes (``HF_SIZE_LIMITS``: layers, width, heads, vocabulary) and
  shorten the samples (``HF_SEQUENCE``).

Any of these but a zoo name may end with workload options, part of the workload as the
size is: ``,seq=N`` (tokens per sample: ``hf:gpt2,seq=1024``,
``models.py:decoder,seq=2048``) and ``,vocab=N`` (the vocabulary: ``hf:gpt2,vocab=32000``).
An ``hf:`` model builds its batches at N tokens (at most the config's position limit;
without it, ``HF_SEQUENCE`` per size) and its embedding and output layers at the
vocabulary given (whatever the size preset); a factory gets ``seq=N`` / ``vocab=N`` and
must take parameters of those names. Profiles, plans and censuses of the same model with
two lengths or vocabularies are two workloads: the options are in the normalised reference
(``seq`` first) and so in its profile key.

The factory protocol (what ``factory()`` returns, or ``factory(size=...)`` when it takes a
``size`` parameter, with ``seq=`` and ``vocab=`` too when the reference gives them): a
``Parts`` (or any
object with these three attributes, a mapping with these keys, or the 3-tuple in this
order):

- ``module``: the ``torch.nn.Module`` to train;
- ``make_batch(batch_size, generator)``: a tuple of CPU tensors whose first dimension is
  ``batch_size`` (one tensor is taken as a 1-tuple), drawn with the ``torch.Generator``
  given, so a batch is reproducible from its seed: how the profiler times steps and the
  built-in worker trains;
- ``loss(module, batch)``: the scalar loss of a forward pass on ``batch``, mean-reduced
  over the batch's samples.

Profiles are stored under ``model_key``: a zoo name as it is, any other reference as a
readable stem plus a digest of the reference, so two different factories never share a
profile. Give the same reference everywhere (profile, request, plan) for the same model.

Parsing a reference and its key need no torch; ``build`` imports the factory.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srifty_core.errors import ConfigError
from srifty_core.workloads.names import MODEL_NAMES, SIZES

if TYPE_CHECKING:
    from srifty_core.workloads.zoo import Workload

__all__ = [
    "HF_CONFIGS",
    "HF_SIZE_LIMITS",
    "ModelRef",
    "ModelRefError",
    "Parts",
    "build",
    "describe",
    "model_key",
    "parse_model",
    "shipped_hf_configs",
    "shrink_hf_config",
]

HF_CONFIGS = Path(__file__).parents[1] / "shipped" / "hf"
"""Shipped Hugging Face configs, one ``NAME.json`` each (``hf:NAME``)."""
HF_SEQUENCE = {"tiny": 16, "small": 64, "full": 128}
"""Tokens per sample of an ``hf:`` model's synthetic batch, per size preset."""
HF_SIZE_LIMITS: dict[str, dict[str, int]] = {
    "tiny": {"layers": 2, "hidden": 64, "heads": 2, "vocab": 512},
    "small": {"layers": 4, "hidden": 256, "heads": 4, "vocab": 8192},
}
"""What ``tiny`` and ``small`` make of an ``hf:`` config, as the zoo's BERT presets do:
at most this many layers, this width (with this many heads and the feed-forward scaled
alike) and this vocabulary; a config already smaller keeps its own. ``full`` builds the
config as it is."""
_HF_LAYERS = ("num_hidden_layers", "encoder_layers", "decoder_layers", "num_decoder_layers")
_HF_HEADS = (
    "num_attention_heads", "encoder_attention_heads", "decoder_attention_heads",
    "num_key_value_heads",
)  # fmt: skip
_HF_FFN = (
    "intermediate_size", "n_inner", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff",
    "hidden_dim",
)  # fmt: skip
_HF_TOKEN_IDS = (
    "pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id",
    "mask_token_id", "decoder_start_token_id",
)  # fmt: skip
MAX_SEQ = 1 << 20
"""The longest sequence a reference may ask for (tokens per sample)."""
MAX_VOCAB = 1 << 24
"""The largest vocabulary a reference may ask for."""
OPTIONS = {"seq": ("tokens per sample", MAX_SEQ), "vocab": ("vocabulary entries", MAX_VOCAB)}
"""The workload options a reference may end with (``,name=N``), in their normal order."""
_OPTION = re.compile(r"^(?P<base>.*),\s*(?P<name>[A-Za-z_]+)\s*=\s*(?P<value>[^,]*)$", re.S)
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ModelRefError(ConfigError):
    """A model reference that cannot be parsed, imported or built; the message is one line
    that starts with ``model:``."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"model: {problem}")


@dataclass(frozen=True, slots=True)
class Parts:
    """What a model factory returns (see the module doc)."""

    module: Any
    make_batch: Callable[[int, Any], Any]
    loss: Callable[[Any, Any], Any]


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A parsed model reference."""

    text: str
    """The reference, normalised (a file path without ``./`` or doubled separators)."""
    kind: str
    """``zoo``, ``module``, ``file`` or ``hf``."""
    target: str
    """The zoo name, the module's dotted name, the file's path, or the hf name or path."""
    factory: str = ""
    seq: int | None = None
    """Tokens per sample (``,seq=N``); ``None``: the kind's own (``HF_SEQUENCE``, or what the
    factory does without it)."""
    vocab: int | None = None
    """Vocabulary entries (``,vocab=N``); ``None``: the config's or the factory's own."""

    @property
    def base(self) -> str:
        """The reference without its options: the model, whatever its length and
        vocabulary."""
        suffix = "".join(f",{k}={v}" for k, v in self.options.items())
        return self.text.removesuffix(suffix)

    @property
    def options(self) -> dict[str, int]:
        """The workload options given (``OPTIONS`` order)."""
        given = {"seq": self.seq, "vocab": self.vocab}
        return {k: v for k, v in given.items() if v is not None}

    @property
    def key(self) -> str:
        """Where the profile store keeps this model's profiles (``model_key``)."""
        if self.kind == "zoo":
            return self.target
        if self.kind == "file":
            stem = f"{Path(self.target).stem}.{self.factory}"
        elif self.kind == "module":
            stem = f"{self.target.rsplit('.', 1)[-1]}.{self.factory}"
        else:
            stem = Path(self.target).stem
        if self.kind == "hf" and Path(self.target).name == "config.json":
            stem = Path(self.target).parent.name or "config"
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.") or "model"
        for name, value in self.options.items():
            stem += f"-{name}{value}"
        digest = hashlib.sha256(self.text.encode()).hexdigest()[:10]
        return f"{self.kind}-{stem}-{digest}"


def shipped_hf_configs() -> list[str]:
    """Names of the shipped Hugging Face configs (``hf:NAME``)."""
    return sorted(p.stem for p in HF_CONFIGS.glob("*.json"))


def _forms() -> str:
    return (
        f"a zoo model ({', '.join(MODEL_NAMES)}), 'package.module:factory', "
        "'path/to/file.py:factory' or 'hf:NAME'"
    )


def parse_model(text: Any) -> ModelRef:
    """Parse a model reference (syntax only: nothing is imported or read)."""
    if not isinstance(text, str) or not text.strip():
        raise ModelRefError(f"must be {_forms()}, got {text!r}")
    text = text.strip()
    base, given = text, {}
    while (option := _OPTION.match(base)) is not None:
        base, name, value = option["base"].strip(), option["name"], option["value"].strip()
        if name not in OPTIONS:
            raise ModelRefError(
                f"{text!r}: unknown option {name!r} after ','; the options are "
                + ", ".join(f"{k}=N ({what})" for k, (what, _) in OPTIONS.items())
            )
        what, most = OPTIONS[name]
        if name in given:
            raise ModelRefError(f"{text!r}: {name} given twice")
        if not value.isdigit() or not 1 <= int(value) <= most:
            raise ModelRefError(
                f"{text!r}: {name} must be a whole number from 1 to {most} ({what}), got {value!r}"
            )
        given[name] = int(value)
    ref = _parse_base(base)
    if not given:
        return ref
    if ref.kind == "zoo":
        raise ModelRefError(
            f"{text!r}: {', '.join(given)} applies to hf: and factory models; a zoo model's "
            "length and vocabulary are its size preset's"
        )
    suffix = "".join(f",{k}={given[k]}" for k in OPTIONS if k in given)
    return ModelRef(
        ref.text + suffix, ref.kind, ref.target, ref.factory, given.get("seq"), given.get("vocab")
    )


def _parse_base(text: str) -> ModelRef:
    if text in MODEL_NAMES:
        return ModelRef(text, "zoo", text)
    if text.startswith("hf:"):
        name = text[3:].strip()
        if not name:
            raise ModelRefError(
                f"'hf:' needs a config: one of {', '.join(shipped_hf_configs())}, "
                "a config.json file or a folder holding one"
            )
        if name in shipped_hf_configs():
            return ModelRef(f"hf:{name}", "hf", name)
        return ModelRef(f"hf:{os.path.normpath(name)}", "hf", os.path.normpath(name))
    if ":" not in text:
        raise ModelRefError(f"unknown model {text!r}: give {_forms()}")
    where, _, factory = text.rpartition(":")
    if not _NAME.match(factory):
        raise ModelRefError(f"{text!r}: {factory!r} after the last ':' is not a Python name")
    if where.endswith(".py") or "/" in where or os.sep in where:
        path = os.path.normpath(where)
        return ModelRef(f"{path}:{factory}", "file", path, factory)
    if not _DOTTED.match(where):
        raise ModelRefError(f"{text!r}: {where!r} is neither a module name nor a .py file")
    return ModelRef(f"{where}:{factory}", "module", where, factory)


_STORED_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def model_key(text: str) -> str:
    """The profile store's name for a model: a zoo name as it is; any other reference
    ``KIND-STEM-DIGEST`` (a digest of the normalised reference); a plain name that is no
    reference (a profile stored under a name of its own, as the tests' and reference
    profiles are) as it is: planning needs profiles, not a model it can build."""
    try:
        return parse_model(text).key
    except ModelRefError:
        if isinstance(text, str) and _STORED_NAME.match(text):
            return text
        raise


def describe(text: str) -> str:
    """One line for a person: what the reference names."""
    ref = parse_model(text)
    if ref.kind == "zoo":
        from srifty_core.workloads.zoo import DESCRIPTIONS

        return DESCRIPTIONS[ref.target]
    what = {
        "module": f"factory {ref.factory} in module {ref.target}",
        "file": f"factory {ref.factory} in {ref.target}",
        "hf": f"Hugging Face architecture from the config {ref.target} (random weights)",
    }[ref.kind]
    extra = [f"{v} {OPTIONS[k][0]}" for k, v in ref.options.items()]
    return ", ".join([what, *extra])


# ---------------------------------------------------------------------------- build
def build(text: str, size: str = "small", seed: int = 0) -> Workload:
    """Build the model ``text`` names with seeded random weights (``torch.manual_seed``
    before the factory runs): a zoo ``Workload`` whatever the kind of reference."""
    ref = parse_model(text)
    if size not in SIZES:
        raise ConfigError(f"size: must be one of {', '.join(SIZES)}, got {size!r}")
    if ref.kind == "zoo":
        from srifty_core.workloads.zoo import build as zoo_build

        return zoo_build(ref.target, size, seed=seed)
    import torch

    torch.manual_seed(seed)
    if ref.kind == "hf":
        return _hf(ref, size)
    factory = _factory(ref)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    kwargs: dict[str, Any] = {"size": size} if "size" in params else {}
    for name, value in ref.options.items():
        if name not in params:
            raise ModelRefError(
                f"{ref.text}: factory {ref.factory} takes no {name!r} parameter; add one "
                f"({OPTIONS[name][0]}), or leave ',{name}=' out"
            )
        kwargs[name] = value
    try:
        made = factory(**kwargs)
    except (Exception, SystemExit) as exc:  # the user's code: theirs to read, in one line
        raise ModelRefError(
            f"factory {ref.text} raised {type(exc).__name__}: {_first_line(exc)}"
        ) from exc
    return _wrap(ref, size, _parts(ref, made))


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):  # sys.exit() in the user's code: not a success
        return f"sys.exit({exc.code!r}) called; a model's code must not exit"
    text = str(exc).strip().splitlines()
    return text[0] if text else "(no message)"


def _factory(ref: ModelRef) -> Callable[..., Any]:
    if ref.kind == "file":
        path = Path(ref.target)
        if not path.is_file():
            raise ModelRefError(f"{ref.text}: file {path} not found (from {Path.cwd()})")
        name = f"srifty_user_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ModelRefError(f"{ref.text}: {path} cannot be loaded as a Python file")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except (Exception, SystemExit) as exc:
                del sys.modules[name]
                raise ModelRefError(
                    f"{ref.text}: running {path} raised {type(exc).__name__}: {_first_line(exc)}"
                ) from exc
    else:
        try:
            module = importlib.import_module(ref.target)
        except (Exception, SystemExit) as exc:
            raise ModelRefError(
                f"{ref.text}: importing {ref.target} failed ({type(exc).__name__}: "
                f"{_first_line(exc)})"
            ) from exc
    factory = getattr(module, ref.factory, None)
    if factory is None:
        raise ModelRefError(f"{ref.text}: {ref.target} has no {ref.factory!r}")
    if not callable(factory):
        raise ModelRefError(
            f"{ref.text}: {ref.factory} is a {type(factory).__name__}, not a callable factory"
        )
    return factory  # type: ignore[no-any-return]


def _parts(ref: ModelRef, made: Any) -> Parts:
    import torch

    if isinstance(made, Parts):
        parts = made
    elif isinstance(made, Mapping) and {"module", "make_batch", "loss"} <= set(made):
        parts = Parts(made["module"], made["make_batch"], made["loss"])
    elif isinstance(made, tuple) and len(made) == 3:
        parts = Parts(*made)
    elif all(hasattr(made, a) for a in ("module", "make_batch", "loss")):
        parts = Parts(made.module, made.make_batch, made.loss)
    else:
        raise ModelRefError(
            f"factory {ref.text} returned {type(made).__name__}; expected "
            "srifty_core.workloads.Parts(module, make_batch, loss)"
        )
    if not isinstance(parts.module, torch.nn.Module):
        raise ModelRefError(
            f"factory {ref.text}: module is a {type(parts.module).__name__}, not a torch.nn.Module"
        )
    for name in ("make_batch", "loss"):
        if not callable(getattr(parts, name)):
            raise ModelRefError(f"factory {ref.text}: {name} is not callable")
    return parts


def _wrap(ref: ModelRef, size: str, parts: Parts) -> Workload:
    import torch

    from srifty_core.workloads.zoo import Workload

    def make(b: int, device: torch.device, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        try:
            out = parts.make_batch(b, gen)
        except Exception as exc:
            raise ModelRefError(
                f"factory {ref.text}: make_batch({b}) raised {type(exc).__name__}: "
                f"{_first_line(exc)}"
            ) from exc
        batch = (out,) if isinstance(out, torch.Tensor) else out
        if (
            not isinstance(batch, (tuple, list))
            or not batch
            or not all(isinstance(t, torch.Tensor) for t in batch)
        ):
            raise ModelRefError(
                f"factory {ref.text}: make_batch({b}) returned {type(out).__name__}; "
                "expected a tensor or a tuple of tensors"
            )
        wrong = [tuple(t.shape) for t in batch if t.dim() == 0 or t.shape[0] != b]
        if wrong:
            raise ModelRefError(
                f"factory {ref.text}: make_batch({b}) returned shapes {wrong}; each tensor's "
                f"first dimension must be the batch size {b}"
            )
        return tuple(batch)

    def loss(module: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        out = parts.loss(module, batch)
        if not isinstance(out, torch.Tensor) or out.numel() != 1:
            raise ModelRefError(
                f"factory {ref.text}: loss returned {type(out).__name__}"
                f"{'' if not isinstance(out, torch.Tensor) else tuple(out.shape)}; "
                "expected a scalar tensor"
            )
        return out.reshape(())

    return Workload(ref.text, size, parts.module, {"ref": ref.text}, make, loss)


def _hf(ref: ModelRef, size: str) -> Workload:
    import torch
    import transformers

    from srifty_core.workloads.zoo import Workload

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    path = _hf_config_path(ref)
    if not path.is_file():
        raise ModelRefError(
            f"{ref.text}: no config at {path}; shipped: {', '.join(shipped_hf_configs())}"
        )
    try:
        config = transformers.AutoConfig.from_pretrained(str(path))
    except Exception as exc:
        raise ModelRefError(
            f"{ref.text}: {path} is not a transformers config ({type(exc).__name__}: "
            f"{_first_line(exc)})"
        ) from exc
    shrink_hf_config(config, size, f"{ref.text} ({path})")
    if ref.vocab is not None:  # what the reference asks for, whatever the size preset
        _set_vocab(config, ref.vocab)
    limit = _position_limit(
        getattr(config, "max_position_embeddings", None), getattr(config, "n_positions", None)
    )
    _check_seq(ref, limit)  # before the model is built: a wrong length costs nothing
    archs = getattr(config, "architectures", None) or []
    cls = getattr(transformers, archs[0], None) if archs else None
    classify = cls is not None and cls.__name__.endswith("ForSequenceClassification")
    if cls is None:
        cls = (
            transformers.AutoModelForMaskedLM
            if getattr(config, "is_decoder", False) is False
            and config.model_type in ("bert", "roberta", "distilbert", "albert", "electra")
            else transformers.AutoModelForCausalLM
        )
    try:
        built = cls.from_config(config) if hasattr(cls, "from_config") else cls(config)
        if not isinstance(built, torch.nn.Module):
            raise TypeError(f"{type(built).__name__} is not a torch module")
        module: torch.nn.Module = built
    except Exception as exc:
        raise ModelRefError(
            f"{ref.text}: building {getattr(cls, '__name__', cls)} from {path} failed "
            f"({type(exc).__name__}: {_first_line(exc)})"
        ) from exc
    seq = ref.seq if ref.seq is not None else min(HF_SEQUENCE[size], limit)
    vocab = int(config.vocab_size)
    labels_n = int(getattr(config, "num_labels", 2))

    def make(b: int, device: torch.device, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        ids = torch.randint(0, vocab, (b, seq), generator=gen)
        if classify:
            return ids, torch.randint(0, labels_n, (b,), generator=gen)
        return ids, ids.clone()

    def loss(m: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        ids, labels = batch
        out: torch.Tensor = m(input_ids=ids, labels=labels).loss
        return out

    knobs = {"ref": ref.text, "config": str(path), "seq": seq, "vocab": vocab}
    return Workload(ref.text, size, module, knobs, make, loss)


def _set_vocab(config: Any, vocab: int) -> None:
    """The config's vocabulary set to ``vocab``, its special tokens kept inside it."""
    config.vocab_size = vocab
    for name in _HF_TOKEN_IDS:
        v = getattr(config, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and v >= vocab:
            setattr(config, name, vocab - 1)


def _hf_config_path(ref: ModelRef) -> Path:
    """Where an ``hf:`` reference's config is (it may not exist)."""
    if ref.target in shipped_hf_configs():
        return HF_CONFIGS / f"{ref.target}.json"
    given = Path(ref.target)
    return given / "config.json" if given.is_dir() else given


def _position_limit(max_positions: Any, n_positions: Any) -> int:
    return int(max_positions or n_positions or 512)


def _check_seq(ref: ModelRef, limit: int) -> None:
    if ref.seq is not None and ref.seq > limit:
        raise ModelRefError(
            f"{ref.text}: seq {ref.seq} is over the config's position limit {limit} "
            "(max_position_embeddings or n_positions)"
        )


def check_sequence(text: str) -> None:
    """An ``hf:`` reference's ``seq`` against its config's position limit, read from the
    config file alone (no torch, no ``transformers``): the one-line error a rank's build
    would raise, before any rank starts. Nothing for other references or a config that
    cannot be read (the build names those)."""
    ref = parse_model(text)
    if ref.kind != "hf" or ref.seq is None:
        return
    try:
        config = json.loads(_hf_config_path(ref).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(config, dict):
        limit = _position_limit(config.get("max_position_embeddings"), config.get("n_positions"))
        _check_seq(ref, limit)


def shrink_hf_config(config: Any, size: str, where: str) -> None:
    """Scale a ``transformers`` config down in place to the ``size`` preset
    (``HF_SIZE_LIMITS``; ``full``: unchanged). Layers, width, heads and feed-forward are
    read through the config's standard names (``hidden_size``, ``num_hidden_layers``,
    ``num_attention_heads``: GPT-2's ``n_embd`` and DistilBERT's ``dim`` answer to them);
    a config without them cannot be scaled and is a ``ModelRefError`` naming ``where``."""
    limits = HF_SIZE_LIMITS.get(size)
    if limits is None:
        return

    def get(name: str) -> int | None:
        v = getattr(config, name, None)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    hidden = get("hidden_size")
    if hidden is None or get("num_hidden_layers") is None or get("num_attention_heads") is None:
        raise ModelRefError(
            f"{where}: size {size} scales a config down through hidden_size, "
            "num_hidden_layers and num_attention_heads, and this config does not name them; "
            "give size full (the config as it is)"
        )
    for name in _HF_LAYERS:
        if (v := get(name)) is not None:
            setattr(config, name, min(v, limits["layers"]))
    if hidden > limits["hidden"]:
        scale = limits["hidden"] / hidden
        width = config.attribute_map.get("hidden_size")  # DistilBERT's `dim`, not `hidden_dim`
        for name in _HF_FFN:
            if name != width and (v := get(name)) is not None:
                setattr(config, name, max(1, round(v * scale)))
        config.hidden_size = limits["hidden"]
        for name in _HF_HEADS:
            if (v := get(name)) is not None:
                setattr(config, name, min(v, limits["heads"]))
        if get("head_dim") is not None:
            config.head_dim = limits["hidden"] // limits["heads"]
    vocab = get("vocab_size")
    if vocab is not None and vocab > limits["vocab"]:
        config.vocab_size = limits["vocab"]
        for name in _HF_TOKEN_IDS:  # special tokens stay inside the smaller vocabulary
            if (v := get(name)) is not None and v >= limits["vocab"]:
                setattr(config, name, limits["vocab"] - 1)
