"""`esft export RUN --to DIR`: a run's final model as a clean Hugging Face folder, ready for
`hf upload ORG/NAME DIR` (huggingface_hub's CLI; `huggingface-cli upload` before 1.0).

The folder holds only what `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained` read: the
weights (safetensors, as the checkpoint stores them), config.json, generation_config.json and the tokenizer files,
plus a model card (README.md) with the training config and the run's held-out results. Checkpoint-only state
(ES fp32 masters and seed-log position, GRPO optimizer / scheduler / RNG state) is left behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from esft.rundir import CHECKPOINTS, current_umask, lock_held, read_jsonl, replace_dir
from esft.saved_config import read_recorded_config, saved_algorithm
from esft.sigterm import signals_deferred
from esft.tasks.labels import summaries_score_name

#: files of a Hugging Face model folder (exact names, then suffixes)
_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json",
                "chat_template.jinja", "chat_template.json", "tokenizer.model")


#: numbered checkpoint folders (esft.rundir.checkpoint_name; TRL's own name before esft moves it)
_NUMBERED = re.compile(r"(?:iter_|checkpoint-)(\d+)")
#: (state file, key) holding a checkpoint's step: ES (esft.es.es_rundir), GRPO (TRL's trainer state)
_STEP_FILES = (("es_state.json", "step"), ("trainer_state.json", "global_step"))


@dataclass
class ExportResult:
    folder: Path
    checkpoint: Path
    files: list[str]


def find_checkpoint(run: str | Path) -> Path:
    """The checkpoint to export: RUN itself when it is a model folder, else RUN/checkpoints/final, else the latest
    numbered checkpoint (`iter_XXXXXX`, as both trainers name them: a run stopped before its final one)."""
    run = Path(run)
    if not run.is_dir():
        raise FileNotFoundError(f"{run} {'is a file, not' if run.exists() else 'does not exist: expected'} a run "
                                "directory or a model folder")
    if (run / "config.json").exists():
        return run
    root = run / CHECKPOINTS
    if (root / "final" / "config.json").exists():
        return root / "final"
    numbered = sorted((p for p in (root.glob("*") if root.is_dir() else []) if p.is_dir()
                       and _NUMBERED.fullmatch(p.name) and (p / "config.json").exists()),
                      key=lambda p: int(_NUMBERED.fullmatch(p.name).group(1)))
    if not numbered and run.resolve().name == CHECKPOINTS and (run.resolve().parent / "config.yaml").is_file():
        # `.` or `..` has no parent to name: the run is the folder above the one they stand for
        above = run.parent if run.name not in ("", "..") else Path(os.path.abspath(run)).parent
        raise FileNotFoundError(f"{run} is a run's checkpoints folder: export the run ({above}) or one "
                                "checkpoint folder inside it")
    if not numbered:
        raise FileNotFoundError(f"{run}: no checkpoint to export (expected {root}/final or a model folder)"
                                f"{es_resume_hint(run)}")
    return numbered[-1]


def es_resume_hint(run: Path) -> str:
    """How an ES run stopped before its first checkpoint gets one: its resume rebuilds the weights from the base
    model and seeds.jsonl (esft.es.replay), trains the iterations left and writes the final checkpoint."""
    if not (run / "seeds.jsonl").is_file():
        return ""
    return (f"; {run} is an ES run without checkpoints: `esft train es --resume {run}` rebuilds its weights from "
            "seeds.jsonl, finishes its iterations and writes checkpoints/final, which can then be exported")


def checkpoint_step(checkpoint: Path) -> int | None:
    """The training step a checkpoint holds: its ES state's `step`, its TRL state's `global_step`, else the number
    in its name; None when unknown."""
    for name, key in _STEP_FILES:
        try:
            return int(json.loads((checkpoint / name).read_text())[key])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    match = _NUMBERED.fullmatch(checkpoint.name)
    return int(match.group(1)) if match else None


def run_dir_of(checkpoint: Path) -> Path:
    """The run directory of a checkpoint folder `RUN/checkpoints/NAME`; a model folder elsewhere is its own."""
    return checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS else checkpoint


def _exported(path: Path) -> bool:
    """Whether `path` is a file an export writes (a model file or the card), so that --overwrite may replace it."""
    return path.is_file() and (path.name == "README.md" or path.name in _MODEL_FILES
                               or (path.name.startswith("model") and path.suffix == ".safetensors"))


def model_files(checkpoint: Path) -> list[Path]:
    return sorted(p for p in checkpoint.iterdir() if p.is_file() and
                  (p.name in _MODEL_FILES or (p.name.startswith("model") and p.suffix == ".safetensors")))


def held_out_results(run: Path) -> list[dict[str, Any]]:
    """The run's held-out evaluations (metrics.jsonl records of kind eval with a test accuracy), in step order."""
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r.get("kind") == "eval"]
    out = []
    for r in rows:
        acc = r.get("test_accuracy", r.get("accuracy"))
        if acc is None:
            continue
        out.append({"step": r.get("step"), "n": r.get("test_n", r.get("n")), "accuracy": acc,
                    "ci95": r.get("test_ci95", r.get("ci95")), "baseline": r.get("test_constant_baseline"),
                    "baseline_ci95": r.get("test_constant_baseline_ci95"), "answer": r.get("test_constant_answer")})
    return out


def without_local_dirs(value: Any) -> Any:
    """`value` (a config, or one of its values) with every absolute local path cut to its last component, options
    kept (`/home/me/data/sums.jsonl:prompt_field=q` -> `sums.jsonl:prompt_field=q`): a card is made to be
    published, and the folders of the machine that trained the model say nothing about it."""
    if isinstance(value, dict):
        return {k: without_local_dirs(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_local_dirs(v) for v in value]
    if isinstance(value, str) and value.startswith(("/", "~")):
        path, sep, options = value.partition(":")
        if _local_path(path):
            return Path(path).name + sep + options
    return value


def without_tokens(value: Any) -> Any:
    """`value` with the value of every key named `token` or `*_token` replaced by `<KEY>`, as transformers writes
    its training arguments: a TRL option in trl_args (`hub_token`, `model_init_kwargs: {token: ...}`) is a
    credential, and the card is made to be published."""
    if isinstance(value, dict):
        return {k: f"<{str(k).upper()}>" if _token_key(k) and v is not None else without_tokens(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [without_tokens(v) for v in value]
    return value


def _token_key(key: Any) -> bool:
    name = str(key).lower()
    return name == "token" or name.endswith("_token")


def _local_path(text: str) -> bool:
    """Whether `text`, which starts with / or ~, names a local file or folder rather than being prose that starts
    so (a system prompt "/no_think Reply with a/b", Qwen3's switch): one on disk, else a path of two or more
    folders without spaces."""
    try:
        if Path(text).expanduser().exists():
            return True
    except (OSError, RuntimeError):  # a name too long for the file system; a ~user that does not exist
        pass
    return text.count("/") >= 2 and not any(c.isspace() for c in text)


def model_card(run: Path, config: dict[str, Any], results: list[dict[str, Any]],
               checkpoint: Path | None = None) -> str:
    """README.md: YAML front matter, what was trained, which checkpoint, the held-out results up to its step, the
    training config (local folders cut, `without_local_dirs`)."""
    from esft.models import embedded_origin, is_hub_id

    config = without_tokens(without_local_dirs(config))
    algorithm = trainer_of(config, checkpoint)
    base = str(config.get("model", ""))
    front = {"library_name": "transformers", "pipeline_tag": "text-generation",
             "tags": ["esft", *{"es": ["evolution-strategies"], "grpo": ["grpo"]}.get(algorithm, [])]}
    if is_hub_id(base) and not Path(base).exists():
        front["base_model"] = base  # a hub id; local folders and embedded names are not hub links
    # an embedded name means nothing outside esft: say which model it is, and that its weights are a quant's
    origin = f" (esft's embedded {embedded_origin(base)})" if embedded_origin(base) else ""
    lines = ["---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "",
             f"# {run.name}", "",
             f"Fine-tuned with esft{f' ({algorithm.upper()})' if algorithm else ''} from `{base}`{origin} on task "
             f"`{config.get('task', '')}`."
             if config else
             "Exported with esft from a model folder with no training config (`config.yaml`) beside it.", ""]
    step = None if checkpoint is None else checkpoint_step(checkpoint)
    if checkpoint is not None and checkpoint.parent.name == CHECKPOINTS and checkpoint.name != "final":
        lines += [f"Weights: checkpoint `{checkpoint.name}`" + (f", step {step}" if step is not None else "")
                  + ", not the run's final checkpoint.", ""]
    if step is not None:  # evaluations after the exported weights describe other weights
        results = [r for r in results if r.get("step") is None or r["step"] <= step]
    if results:
        # a custom reward scored outside [0, 1] is a mean reward, not an accuracy
        name = summaries_score_name(results, "accuracy", "ci95")
        # an accuracy means little without what always giving the most frequent gold answer scores on the same
        # examples (a "yes" prior on BoolQ); a mean reward has no such baseline
        baseline = name == "accuracy" and any(r.get("baseline") is not None for r in results)
        extra = (" constant answer | 95% CI |", "---|---|") if baseline else ("", "")
        lines += ["## Held-out results", "", f"| step | n | {name} | 95% CI |{extra[0]}",
                  f"|---|---|---|---|{extra[1]}"]
        for r in results:
            row = f"| {r['step']} | {r['n']} | {r['accuracy']:.3f} | {_interval(r.get('ci95'))} |"
            if baseline:
                value = r.get("baseline")
                row += f" {'' if value is None else f'{value:.3f}'} | {_interval(r.get('baseline_ci95'))} |"
            lines.append(row)
        # a reward function's baseline is the best of the most frequent gold answers, not the most frequent one
        answers = {str(r["answer"]) for r in results if r.get("baseline") is not None and r.get("answer") is not None}
        said = f" (`{answers.pop()}`)" if len(answers) == 1 else ""
        latest = max((r["step"] for r in results if r.get("step") is not None), default=None)
        # an interrupted run's checkpoint usually falls between evaluations: its own accuracy was never measured
        unmeasured = (f" No held-out evaluation was made at step {step}, the exported weights' step: the last row "
                      f"is step {latest}'s." if step is not None and latest is not None and latest < step else "")
        lines += ["", "Step 0 is the model before training." + unmeasured
                  + (f" Constant answer: the score of always giving one gold answer{said} on the same examples, the "
                     "best of their most frequent ones." if baseline else ""), ""]
    elif config:  # a model folder with no run beside it has no record to speak of
        lines += ["The run recorded no held-out evaluation.", ""]
    lines += ["## Use", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
              'model = AutoModelForCausalLM.from_pretrained("PATH_OR_REPO")',
              'tokenizer = AutoTokenizer.from_pretrained("PATH_OR_REPO")', "```", ""]
    if config:
        lines += ["## Training config", "", "```yaml", yaml.safe_dump(config, sort_keys=False).strip(), "```", ""]
    return "\n".join(lines)


def trainer_of(config: dict[str, Any], checkpoint: Path | None) -> str | None:
    """'es' or 'grpo': the trainer of the run by its config, else by the state file its checkpoint holds (a
    checkpoint folder copied out of its run); None for a model folder that shows neither."""
    found = saved_algorithm(config)
    if found is None and checkpoint is not None:
        found = next((algo for algo, (name, _) in zip(("es", "grpo"), _STEP_FILES) if (checkpoint / name).is_file()),
                     None)
    return found


class DamagedWeights(RuntimeError):
    """A checkpoint's safetensors or JSON file that does not load (a truncated copy): a damaged run directory, not
    bad input (the CLI exits 1)."""


def check_weights(files: list[Path]) -> None:
    """Raise DamagedWeights unless every safetensors file among `files` opens and every JSON file holds an object:
    the export would otherwise copy a truncated file and print the upload command for a model that no loader can
    read (or stop on config.json with a JSON error naming no file)."""
    from safetensors import safe_open

    for path in files:
        try:
            if path.suffix == ".safetensors":
                with safe_open(str(path), "pt"):
                    pass
            elif path.suffix == ".json" and not isinstance(json.loads(path.read_text()), dict):
                raise ValueError("not a JSON object")
        except Exception as exc:  # safetensors raises its own error type for every kind of bad file
            raise DamagedWeights(f"{path} is damaged ({exc}): resume the run (`esft train es|grpo --resume`) to "
                                 f"write its checkpoint again, or export an earlier checkpoint folder") from None


def _interval(ci: Any) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci and len(ci) == 2 else ""


def with_kv_cache(config_path: Path) -> None:
    """Sets `use_cache` true in a model's config.json where training left it false (a GRPO checkpoint's: TRL's
    training turns the KV cache off), so the exported model generates with its cache, as the base model does."""
    config = json.loads(config_path.read_text())
    if config.get("use_cache") is False:
        config["use_cache"] = True
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def move_into_place(staging: Path, target: Path) -> None:
    """The built export into `target`. A Ctrl-C or SIGTERM meanwhile takes effect once it is in place: between two
    renames it left the target with some of the files, or (--overwrite) none, the earlier export moved aside."""
    with signals_deferred():
        if target.is_dir() and not any(target.iterdir()):  # an empty folder the user made (or stands in) stays
            for p in staging.iterdir():
                os.replace(p, target / p.name)
        else:
            replace_dir(staging, target)  # the old target is renamed aside and deleted last: never half gone


def export_run(run: str | Path, to: str | Path, overwrite: bool = False) -> ExportResult:
    """Copy the run's final model into `to` as a clean Hugging Face folder with a model card."""
    if not str(to).strip():  # Path("") is the current folder, which --overwrite would replace
        raise ValueError("--to is empty: name the folder to write")
    run, to = Path(run), Path(to)
    checkpoint = find_checkpoint(run)
    # resolved: `.` (the run or checkpoint folder one stands in) names no run for the card's title, config, results
    run_dir = (run if checkpoint != run else run_dir_of(checkpoint.resolve())).resolve()
    if to.exists() and not to.is_dir():
        raise NotADirectoryError(f"--to {to} is a file, not a folder (name a new or empty folder)")
    blocking = next((p for p in to.absolute().parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:  # mkdir would say only "File exists" of it
        raise NotADirectoryError(f"--to {to}: {blocking} is a file, not a folder (name a folder whose parents are "
                                 "folders)")
    target = to.resolve()
    held = [p for p in (run, checkpoint, run_dir) if p.resolve() == target or target in p.resolve().parents]
    if held:  # --overwrite would replace the run itself (seed log, metrics, checkpoints) by the exported model
        raise ValueError(f"--to {to} holds the run being exported ({held[0]}): name a folder outside it")
    checkpoints = (run_dir / CHECKPOINTS).resolve()
    if checkpoints in target.parents:  # a later export of the run would take the model there for its checkpoint
        raise ValueError(f"--to {to} is inside the run's checkpoints ({checkpoints}), where a later export of the run "
                         "takes any model folder for a checkpoint: name a folder outside it")
    if to.exists() and any(to.iterdir()) and not overwrite:
        raise ValueError(f"{to} is not empty (pass --overwrite to replace an earlier export there)")
    foreign = sorted(p.name for p in to.iterdir() if not _exported(p)) if to.is_dir() else []
    if foreign:  # --overwrite replaces the whole folder: a clone's .git, notes, other models would go with it
        raise ValueError(f"--to {to} holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}, which an "
                         "export does not write: --overwrite replaces the whole folder and would delete them. Export "
                         "to a new folder and copy its files over, or move them out first")
    here = Path.cwd().resolve()
    if overwrite and to.is_dir() and any(to.iterdir()) and (target == here or target in here.parents):
        # replaced by a new folder, it would leave the shell standing in a deleted one
        raise ValueError(f"--to {to} is the folder this command runs in (or holds it): --overwrite replaces the "
                         "whole folder; run the export from outside it")
    files = model_files(checkpoint)
    if not any(p.suffix == ".safetensors" for p in files):
        raise FileNotFoundError(f"{checkpoint}: no safetensors weights")
    if not any(p.name == "tokenizer_config.json" for p in files):
        raise FileNotFoundError(f"{checkpoint}: no tokenizer files to export")
    check_weights(files)
    if lock_held(run_dir):  # a run still training: its latest checkpoint, which the card names, is no final model
        warnings.warn(f"{run_dir} is still training (an esft process holds its lock): exporting its latest "
                      f"checkpoint, {checkpoint.name}, not its final model", stacklevel=2)
    config_path = run_dir / "config.yaml"  # a damaged one is refused before any folder is made
    train_config = read_recorded_config(config_path) if config_path.exists() else {}
    train_config = {k: v for k, v in train_config.items() if k != "_run"}
    # built in a fresh folder beside the target and moved into place: an --overwrite export never keeps files of
    # an earlier one (stale shards, tokenizer files), and an interrupted export leaves the target as it was. The
    # resolved target: a symlink's folder is the one to fill, and `.` has no name to build beside
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as exc:  # the error would name the hidden staging folder, which the user never asked for
        raise OSError(exc.errno, f"cannot write the export beside --to {to} ({exc.strerror})", str(target.parent)) \
            from None
    # a folder to share takes the modes of any new folder and file (the umask's), not mkdtemp's private 0700 nor
    # the 0600 that safetensors gives the weights it writes
    os.chmod(staging, 0o777 & ~current_umask())
    try:
        for p in files:
            shutil.copyfile(p, staging / p.name)
        with_kv_cache(staging / "config.json")
        if not (staging / "generation_config.json").exists():
            from transformers import GenerationConfig

            config = json.loads((checkpoint / "config.json").read_text())
            GenerationConfig.from_dict({k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                                        if config.get(k) is not None}).save_pretrained(staging)
        (staging / "README.md").write_text(model_card(run_dir, train_config, held_out_results(run_dir),
                                                      checkpoint.resolve()))
        move_into_place(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return ExportResult(to, checkpoint, sorted(p.name for p in to.iterdir()))


__all__ = ["DamagedWeights", "ExportResult", "check_weights", "checkpoint_step", "export_run", "find_checkpoint",
           "held_out_results", "model_card", "model_files", "run_dir_of", "trainer_of"]
