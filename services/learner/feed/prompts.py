"""The run's prompts: read once (StartRun reports bad data before a run starts), mapped from the
data set's columns (``data.fields``), chat ``messages`` rendered with the model's chat template,
split into training and held-out prompts, checked against the model's context, and visited in a
deterministic order that a checkpointed cursor can resume.

What a row becomes: the ``fields.prompt`` column is the prompt — a string, or a list of
``{role, content}`` messages rendered by the tokenizer's chat template (``data.chat_template``
overrides it) with the generation prompt appended; ``fields.reference`` is the ground truth
handed to the reward function (missing: empty); each ``fields.extra`` column travels beside it
to the reward function (``ScoreRequest.extra``). Values that are not strings are JSON-encoded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from brorl import sampling
from brorl.errors import InvalidArgument
from brorl.config.run import DataConfig, RunConfig
from brorl.sampling import DEFAULT_MAX_TOKENS
from brorl.v1 import common_pb2
from services.learner.feed.chat_turns import chat_turn
from services.learner.feed.datafiles import read_rows

log = logging.getLogger(__name__)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass(frozen=True)
class Prompt:
    text: str
    reference: str
    extra: dict[str, str] = field(default_factory=dict)
    # The prompt as the model's tokenizer encodes it, once, at load: the context check counts
    # these and the jobs carry them, so the worker samples from (and the learner trains on)
    # exactly these ids. Empty without a tokenizer (the worker then tokenizes the text).
    token_ids: tuple[int, ...] = ()
    stratum: str = ""  # the held-out prompt's stratum (data.fields.stratum; '': none)


@dataclass
class RunPrompts:
    train: list[Prompt]
    heldout: list[Prompt]  # evaluated every `eval_every` steps, never trained on
    too_long: int = 0  # prompts left out: their tokens + max_tokens exceed the context
    context: int | None = None  # the model's context length (None: unknown)
    # what every job asks of the worker's episodes (empty: single-turn paths)
    env: common_pb2.EnvironmentParams = field(default_factory=common_pb2.EnvironmentParams)


def _text(value) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _is_messages(value) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) for m in value)


def _check_messages(messages: list, where: str) -> list[dict]:
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InvalidArgument(
                "data.fields.prompt", f"{where}: message {i} needs string 'role' and 'content'"
            )
    if not messages:
        raise InvalidArgument("data.fields.prompt", f"{where}: empty messages list")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _stratum(value, where: str) -> str:
    """A stratum name as it appears in metric names (eval/accuracy/<stratum>)."""
    name = _text(value).strip()
    if not re.fullmatch(r"[A-Za-z0-9_.-]{0,64}", name):
        raise InvalidArgument(
            "data.fields.stratum",
            f"{where}: stratum {name[:80]!r} must be at most 64 letters, digits, '_', '.' or '-'",
        )
    return name


def rows_to_prompts(rows: list[dict], data: DataConfig, tokenizer, source: str) -> list[Prompt]:
    """Map rows to prompts; InvalidArgument names the first bad row (1-based)."""
    f = data.fields
    out = []
    for n, row in enumerate(rows, 1):
        where = f"{source} row {n}"
        value = row.get(f.prompt)
        if _is_messages(value):
            text = render_chat(_check_messages(value, where), tokenizer, data.chat_template)
        elif isinstance(value, str) and value:
            text = value
        else:
            have = ", ".join(sorted(map(str, row))) or "none"
            raise InvalidArgument(
                "data.fields.prompt",
                f"{where} needs a non-empty string or a messages list in column {f.prompt!r} "
                f"(columns: {have})",
            )
        missing = [c for c in f.extra if c not in row]
        if missing:
            raise InvalidArgument("data.fields.extra", f"{where} has no column(s) {missing}")
        extra = {c: _text(row[c]) for c in f.extra}
        stratum = _stratum(row.get(f.stratum), where) if f.stratum else ""
        out.append(Prompt(text, _text(row.get(f.reference)), extra, stratum=stratum))
    return out


def render_chat(messages: list[dict], tokenizer, template: str) -> str:
    """The prompt text of a chat: the template applied, the assistant's turn opened."""
    if tokenizer is None:
        raise InvalidArgument(
            "data.fields.prompt",
            "chat messages need the model's tokenizer, and the model directory has none",
        )
    if not (template or getattr(tokenizer, "chat_template", None)):
        raise InvalidArgument(
            "data.chat_template",
            "the prompts are chat messages but the model's tokenizer has no chat template; "
            "set data.chat_template (a Jinja template) or give the tokenizer one",
        )
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, chat_template=template or None
        )
    except Exception as exc:  # noqa: BLE001 - a user template's Jinja error is the caller's error
        raise InvalidArgument(
            "data.chat_template", f"rendering failed: {type(exc).__name__}: {exc}"
        ) from None


def load_tokenizer(model_dir: str):
    """The model's tokenizer, or None when its directory holds none (a test fake)."""
    if not any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _model_json(model_dir: str, name: str) -> dict:
    path = Path(model_dir) / name
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return {}


def model_context(model_dir: str) -> int | None:
    """The context length the model's config declares (max_position_embeddings)."""
    n = _model_json(model_dir, "config.json").get("max_position_embeddings")
    return n if isinstance(n, int) and n > 0 else None


def resolve_model_defaults(cfg: RunConfig) -> None:
    """Fill what the run config left to the model: ``sampling.max_tokens`` from its
    generation_config.json ``max_new_tokens`` (else brorl.sampling's default)."""
    if cfg.sampling.max_tokens is None:
        n = _model_json(cfg.model, "generation_config.json").get("max_new_tokens")
        cfg.sampling.max_tokens = n if isinstance(n, int) and n > 0 else DEFAULT_MAX_TOKENS


def load_run_prompts(cfg: RunConfig) -> RunPrompts:
    """Training and held-out prompts of ``cfg`` (resolving the model's defaults first); prompts
    whose tokens plus ``sampling.max_tokens`` exceed the model's context are left out and
    counted."""
    resolve_model_defaults(cfg)
    data = cfg.data
    tokenizer = load_tokenizer(cfg.model)  # chat rendering and the context check
    rows = read_rows(data.train_path, data.format, data.split, "data.train_path")
    train = rows_to_prompts(rows, data, tokenizer, Path(data.train_path).name)
    heldout: list[Prompt] = []
    if data.eval_path:
        rows = read_rows(data.eval_path, data.format, data.split, "data.eval_path")
        heldout = rows_to_prompts(rows, data, tokenizer, Path(data.eval_path).name)
    elif data.eval_split:
        rows = read_rows(data.train_path, data.format, data.eval_split, "data.eval_split")
        heldout = rows_to_prompts(rows, data, tokenizer, f"split {data.eval_split}")
    elif data.eval_fraction > 0:
        train, heldout = split_heldout(train, data.eval_fraction, data.shuffle_seed)
    heldout = heldout[: data.eval_max_prompts]
    if tokenizer is not None:
        train, heldout = _tokenized(train, tokenizer), _tokenized(heldout, tokenizer)
    context = model_context(cfg.model)
    too_long = 0
    if tokenizer is not None and context is not None:
        budget = context - cfg.sampling.max_tokens
        train, too_long = _fitting(train, budget)
        heldout, heldout_too_long = _fitting(heldout, budget)
        too_long += heldout_too_long
        if too_long:
            log.warning(
                "%d prompts left out: longer than %d tokens (context %d - max_tokens %d)",
                too_long,
                budget,
                context,
                cfg.sampling.max_tokens,
            )
    if not train:
        raise InvalidArgument(
            "data.train_path",
            f"no training prompt fits the model's context of {context} tokens with "
            f"sampling.max_tokens={cfg.sampling.max_tokens} ({too_long} too long)"
            if too_long
            else "no training prompts left after the held-out split",
        )
    if cfg.eval_every and not heldout:
        raise InvalidArgument(
            "eval_every",
            "is set but there are no held-out prompts: set data.eval_path, "
            "data.eval_split or data.eval_fraction",
        )
    return RunPrompts(train, heldout, too_long, context, environment(cfg, tokenizer))


def environment(cfg: RunConfig, tokenizer) -> common_pb2.EnvironmentParams:
    """The jobs' episode parameters; with ``env.chat``, the chat turn of the model's template."""
    chat = cfg.env is not None and cfg.env.chat
    turn = chat_turn(tokenizer, cfg.data.chat_template) if chat else None
    return sampling.environment_params(cfg.env, turn)


def split_heldout(prompts: list[Prompt], fraction: float, seed: int):
    """A deterministic held-out share of ``prompts`` (at least one when fraction > 0)."""
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    k = max(1, round(fraction * len(prompts)))
    held = set(order[:k])
    return [p for i, p in enumerate(prompts) if i not in held], [prompts[i] for i in order[:k]]


def _tokenized(prompts: list[Prompt], tokenizer) -> list[Prompt]:
    """``prompts`` with their token ids, encoded as the rollout engine would encode the text
    (special tokens added as by default)."""
    if not prompts:
        return prompts
    ids = tokenizer([p.text for p in prompts])["input_ids"]
    return [dataclasses.replace(p, token_ids=tuple(i)) for p, i in zip(prompts, ids)]


def _fitting(prompts: list[Prompt], budget: int) -> tuple[list[Prompt], int]:
    keep = [p for p in prompts if len(p.token_ids) <= budget]
    return keep, len(prompts) - len(keep)


def load_prompts(path: str, field: str = "data.train_path") -> list[Prompt]:
    """A JSONL (or any data file) of {"prompt", "reference"} rows with the default columns,
    no chat rendering: e.g. the probe set; InvalidArgument names ``field``."""
    rows = read_rows(path, "auto", "train", field)
    return rows_to_prompts(rows, DataConfig(train_path=path), None, Path(path).name)


class PromptOrder:
    """Deterministic prompt order: a fresh permutation per epoch, addressed by a cursor."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self._epoch, self._perm = -1, []

    def __getitem__(self, cursor: int) -> int:
        epoch, i = divmod(cursor, self.n)
        if epoch != self._epoch:
            self._perm = list(range(self.n))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._perm)
            self._epoch = epoch
        return self._perm[i]
