"""The LLM proposer: litellm to any provider (`--model provider/name`, keys from the provider's usual
environment variables, `--api-base` / CAKE_LLM_API_BASE for OpenAI-compatible servers, optional
CAKE_LLM_API_KEY).

One proposal = one prompt (agent/prompts.py) -> one reply -> an IR program or a JSON Patch (RFC 6902)
against the base program -> accepted IR primitives used as statements expanded (agent/primitive_use.py)
-> schema validation (cake_ir.io.load). A reply that is not usable (not JSON, not a program or patch,
a patch that does not apply, an unknown primitive or wrong primitive parameters, a schema violation)
gets exactly one repair turn quoting the exact error; if the second reply fails too, the proposal is
recorded as a proposer failure (code E-PROPOSER-REPLY) and no candidate is made.

Budgets: tokens and cost are counted from each response's `usage` (and litellm.completion_cost where
the model has a price). Before every call the strategy checks `--token-budget` / `--cost-budget`; a
call's max_tokens is capped at what is left. When a budget is spent the strategy stops (and the run
stops when no other strategy is active). A call that raises (network, HTTP error) is a proposer
failure E-PROPOSER-CALL; three in a row stop the strategy, and a refusal of the credentials (401/403)
stops it at once. `credential_problem` checks for the provider's keys before a run starts; each call
waits at most `--llm-timeout` seconds.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Optional

from . import prompts
from .candidates import ProposeContext, make_candidate

MAX_CONSECUTIVE_CALL_FAILURES = 3
MAX_FAILURES_IN_PROMPT = 4
MAX_REPLY_CHARS = 1_000_000   # an IR program is a few tens of KB; a larger reply is rejected unread
MAX_REPLY_DEPTH = 80          # nesting beyond what an IR document (cake_ir.io.MAX_DEPTH) can use
K_TACTICS = 4                 # retrieved tactics and experience notes offered to the prompt (the
K_NOTES = 6                   # character budget decides how many of them go in)
DEFAULT_KNOWLEDGE_CHARS = 4000


class ReplyError(ValueError):
    pass


_SECRET_ENV = re.compile(r"(API_KEY|API_TOKEN|SECRET|ACCESS_KEY|AUTH_TOKEN)", re.I)
_KEY_SHAPE = re.compile(r"\b(sk|pk|rk|key|tok)-[A-Za-z0-9_\-]{8,}|\bBearer\s+\S{8,}", re.I)


def redact(text: str) -> str:
    """`text` with API keys removed: every secret-looking environment value, and key-shaped tokens.
    Error texts from providers (or proxies) can echo the key; they are stored in the DB and reports."""
    text = str(text)
    for name, value in os.environ.items():
        if value and len(value) >= 8 and _SECRET_ENV.search(name) and value in text:
            text = text.replace(value, f"<{name}>")
    return _KEY_SHAPE.sub("<redacted>", text)


def extract_json(text: str):
    """The JSON value in a reply: a ```json fence if present, else the outermost {...} or [...].

    The reply is only ever parsed as JSON data: nothing in it is executed, imported or evaluated."""
    if text is None:
        raise ReplyError("the reply is empty")
    if len(text) > MAX_REPLY_CHARS:
        raise ReplyError(f"the reply is {len(text)} characters; at most {MAX_REPLY_CHARS} are read "
                         "(reply with a JSON Patch or one IR program)")
    m = re.search(r"```(?:json)?\s*\n(.*?)```", text, re.S)
    body = m.group(1) if m else text.strip()
    if not m:
        starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
        if starts:
            s = min(starts)
            e = max(body.rfind("}"), body.rfind("]"))
            if e > s:
                body = body[s:e + 1]
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ReplyError(f"the reply is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except (RecursionError, ValueError) as e:
        raise ReplyError(f"the reply is not usable JSON ({type(e).__name__})") from None
    from cake_ir.io import _depth
    if _depth(obj, MAX_REPLY_DEPTH) > MAX_REPLY_DEPTH:
        raise ReplyError(f"the reply nests deeper than {MAX_REPLY_DEPTH} levels")
    return obj


def parse_reply(text: str, base_ir: dict) -> tuple[dict, str]:
    """(program dict, "patch" | "program"); raises ReplyError with the exact problem. Primitive
    statements of the program (or of the patched base) are expanded before it is loaded."""
    from cake_ir.io import load
    from tactics.jsonpatch import PatchError, apply_patch

    from .primitive_use import PrimitiveUseError, expand_primitive_statements

    obj = extract_json(text)
    if isinstance(obj, list):
        patch, program = obj, None
    elif isinstance(obj, dict) and "patch" in obj:
        patch, program = obj["patch"], None
    elif isinstance(obj, dict) and isinstance(obj.get("kernel"), dict):
        patch, program = None, obj["kernel"]
    elif isinstance(obj, dict) and isinstance(obj.get("program"), dict):   # a multi-kernel Program
        patch, program = None, obj["program"]
    elif isinstance(obj, dict) and ("roles" in obj or "launch" in obj or "kernels" in obj):
        patch, program = None, obj
    else:
        raise ReplyError('expected {"patch": [...]} (a JSON Patch against the base program), {"kernel": {...}} '
                         '(a CAKE IR Kernel document) or {"program": {...}} (a CAKE IR Program); '
                         f"got {type(obj).__name__} with keys "
                         f"{sorted(obj)[:8] if isinstance(obj, dict) else '-'}")
    mode = "program"
    if patch is not None:
        try:
            program = apply_patch(base_ir, patch, lenient_replace=True)
        except PatchError as e:
            raise ReplyError(f"the JSON Patch does not apply to the base program: {e}") from None
        mode = "patch"
    try:       # accepted IR primitives used as statements become their statements (agent/primitive_use.py)
        program = expand_primitive_statements(program)
    except PrimitiveUseError as e:
        raise ReplyError(f"a primitive statement cannot be expanded: {e}") from None
    kernel, diags = load(program)
    if kernel is None:
        raise ReplyError("the program does not match the CAKE IR schema: "
                         + "; ".join(d.short() for d in diags[:8]))
    return program, mode


DEFAULT_TIMEOUT_S = 180.0


def credential_problem(model: str, api_base: Optional[str] = None) -> Optional[str]:
    """Why a call to `model` cannot authenticate, said plainly (None when the provider's keys are in
    the environment, or a server URL / CAKE_LLM_API_KEY is given: a local server may need none)."""
    if api_base or os.environ.get("CAKE_LLM_API_BASE") or os.environ.get("CAKE_LLM_API_KEY"):
        return None
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm
    try:
        env = litellm.validate_environment(model=model)
    except Exception as e:  # noqa: BLE001 - an unknown provider: litellm says which
        return f"the model {model!r} is not one litellm knows how to call ({type(e).__name__}: {str(e)[:200]})"
    missing = list(env.get("missing_keys") or [])
    if env.get("keys_in_environment") or not missing:
        return None
    return (f"no credentials for {model}: set {' and '.join(missing)} in the environment (or CAKE_LLM_API_KEY), "
            f"or give --api-base for an OpenAI-compatible server")


def is_auth_error(e: BaseException) -> bool:
    """A provider's refusal of the credentials (not worth retrying)."""
    try:
        import litellm
        if isinstance(e, getattr(litellm, "AuthenticationError", ())):
            return True
    except ImportError:
        pass
    return getattr(e, "status_code", None) in (401, 403)


def call_llm(model: str, messages: list, *, api_base: Optional[str], max_tokens: int,
             timeout: float = DEFAULT_TIMEOUT_S) -> dict:
    """One chat completion through litellm; returns {"text", "usage", "cost_usd", "seconds"}."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    kw = {"model": model, "messages": messages, "max_tokens": int(max_tokens), "timeout": timeout}
    base = api_base or os.environ.get("CAKE_LLM_API_BASE")
    if base:
        kw["api_base"] = base
    if os.environ.get("CAKE_LLM_API_KEY"):
        kw["api_key"] = os.environ["CAKE_LLM_API_KEY"]
    t0 = time.perf_counter()
    resp = litellm.completion(**kw)
    text = resp.choices[0].message.content or ""
    u = getattr(resp, "usage", None)
    usage = {"prompt_tokens": int(getattr(u, "prompt_tokens", 0) or 0),
             "completion_tokens": int(getattr(u, "completion_tokens", 0) or 0),
             "total_tokens": int(getattr(u, "total_tokens", 0) or 0)}
    if not usage["total_tokens"]:
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    try:
        cost = float(litellm.completion_cost(completion_response=resp) or 0.0)
    except Exception:  # noqa: BLE001 - unknown price: count tokens only
        cost = 0.0
    return {"text": text, "usage": usage, "cost_usd": cost, "seconds": time.perf_counter() - t0}


class LLMStrategy:
    proposer = "llm"

    def __init__(self, name: str = "llm"):
        self.name = name
        self._stats_cache: dict = {}

    def knowledge(self, ctx: ProposeContext, member: dict, failures: list) -> str:
        """The prompt's knowledge section: tactics ranked by meaning for this task, failures and
        bottleneck (with their statistics on this task and arch from earlier runs), and the most
        relevant experience notes of earlier runs (Chroma "experiences"; the newest NoteRows when the
        vector store cannot be opened), within RunConfig.knowledge_chars characters."""
        from tactics.base import retrieve
        task = ctx.entry.name
        arch = member["genome"]["ir"].get("arch") or ""
        query = prompts.retrieval_query(ctx.entry, member, failures)
        tactics = retrieve(query, k=K_TACTICS, arch=arch or None)
        budget = int(getattr(ctx.cfg, "knowledge_chars", DEFAULT_KNOWLEDGE_CHARS) or 0)
        return prompts.knowledge_section(tactics, self._stats(task, arch), self._notes(query, task), budget)

    def _stats(self, task: str, arch: str) -> dict:
        key = (task, arch)
        if key not in self._stats_cache:       # statistics change between runs, not during one
            try:
                from knowledge.store import Store
                from knowledge.tactic_stats import stats
                store = Store()
                try:
                    self._stats_cache[key] = stats(store, task=task, arch=arch or None)
                finally:
                    store.close()
            except Exception:  # noqa: BLE001 - no statistics: the tactics go in without them
                self._stats_cache[key] = {}
        return self._stats_cache[key]

    def _notes(self, query: str, task: str) -> list[str]:
        try:
            from knowledge.vectors import default_store
            vs = default_store()
            hits = vs.query("experiences", query, k=K_NOTES, task=task)
            if len(hits) < K_NOTES:     # too few on this task: relevant notes of other tasks too
                ids = {h["id"] for h in hits}
                hits += [h for h in vs.query("experiences", query, k=K_NOTES) if h["id"] not in ids]
            return [h["text"] for h in hits[:K_NOTES]]
        except Exception:  # noqa: BLE001 - Chroma unavailable: the newest notes of this task from the DB
            try:
                from knowledge.experience import recent_notes
                from knowledge.store import Store
                store = Store()
                try:
                    return [n.text for n in recent_notes(store, task, K_NOTES)]
                finally:
                    store.close()
            except Exception:  # noqa: BLE001
                return []

    def _budget_left(self, st: dict, cfg) -> Optional[str]:
        """None while the budgets allow another call, else why not."""
        if cfg.token_budget is not None and st.get("tokens", 0) >= cfg.token_budget:
            return f"token budget exhausted ({st.get('tokens', 0)} of {cfg.token_budget} tokens)"
        if cfg.cost_budget is not None and st.get("cost_usd", 0.0) >= cfg.cost_budget:
            return f"cost budget exhausted (${st.get('cost_usd', 0.0):.4f} of ${cfg.cost_budget:.4f})"
        return None

    def _call(self, st: dict, cfg, messages: list) -> dict:
        max_tokens = cfg.reply_tokens
        if cfg.token_budget is not None:
            max_tokens = max(1, min(max_tokens, cfg.token_budget - st.get("tokens", 0)))
        r = call_llm(cfg.model, messages, api_base=cfg.api_base, max_tokens=max_tokens,
                     timeout=getattr(cfg, "llm_timeout", None) or DEFAULT_TIMEOUT_S)
        st["calls"] = st.get("calls", 0) + 1
        for k in ("prompt_tokens", "completion_tokens"):
            st[k] = st.get(k, 0) + r["usage"][k]
        st["tokens"] = st.get("tokens", 0) + r["usage"]["total_tokens"]
        st["cost_usd"] = round(st.get("cost_usd", 0.0) + r["cost_usd"], 6)
        return r

    def propose(self, st: dict, n: int, ctx: ProposeContext) -> tuple[list[dict], list[dict]]:
        cfg = ctx.cfg
        cands, failures = [], []
        for k in range(n):
            why = self._budget_left(st, cfg)
            if why:
                st["active"], st["inactive_reason"] = False, why
                break
            if not st["pop"]:
                st["active"], st["inactive_reason"] = False, "no base program (every seed failed)"
                break
            member = st["pop"][0]
            fails = st.get("last_failures", [])[:MAX_FAILURES_IN_PROMPT]
            messages, meta = prompts.build(ctx.entry, member, measured=not ctx.dry_run, spec_name=ctx.spec.name,
                                           dry_run=ctx.dry_run, failures=fails, notes=ctx.notes,
                                           context_tokens=cfg.context_tokens,
                                           knowledge=self.knowledge(ctx, member, fails))
            st["last_prompt"] = meta
            fail = None
            program, mode, turns = None, None, 0
            try:
                for turn in range(2):
                    if turn == 1:
                        why = self._budget_left(st, cfg)
                        if why:
                            fail = {"code": "E-PROPOSER-BUDGET", "message": f"no repair turn: {why}"}
                            break
                    r = self._call(st, cfg, messages)
                    turns += 1
                    try:
                        program, mode = parse_reply(r["text"], member["genome"]["ir"])
                        break
                    except ReplyError as e:
                        if turn == 0:
                            messages = messages + [{"role": "assistant", "content": r["text"]}, prompts.repair_message(str(e))]
                            st["repairs"] = st.get("repairs", 0) + 1
                        else:
                            fail = {"code": "E-PROPOSER-REPLY", "message": str(e)}
                st["consecutive_failures"] = 0
            except Exception as e:  # noqa: BLE001 - a failed call is recorded, not raised
                fail = {"code": "E-PROPOSER-CALL", "message": redact(f"{type(e).__name__}: {str(e)[:800]}")}
                st["consecutive_failures"] = st.get("consecutive_failures", 0) + 1
                if is_auth_error(e):      # a wrong or missing key does not get better by retrying
                    st["active"], st["fatal"] = False, True
                    st["inactive_reason"] = (f"the provider refused the credentials for {cfg.model} (check its API "
                                             f"key): {fail['message'][:200]}")
                elif st["consecutive_failures"] >= MAX_CONSECUTIVE_CALL_FAILURES:
                    st["active"], st["inactive_reason"] = False, f"{st['consecutive_failures']} failed calls in a row: {fail['message'][:200]}"
            if program is not None:
                cand, diags = make_candidate({"ir": program, "recipe": None}, ctx, strategy=self.name,
                                             proposer=self.proposer, tactic=f"llm_{mode}", params={"turns": turns},
                                             parent=member)
                if cand is None:
                    fail = {"code": "E-PROPOSER-REPLY", "message": "the program does not load: " + str(diags)[:500]}
                elif cand["hash"] in ctx.seen or any(c["hash"] == cand["hash"] for c in cands):
                    fail = {"code": "E-PROPOSER-DUPLICATE",
                            "message": f"the reply is a program already evaluated in this run (hash {cand['hash']})"}
                else:
                    cand["prompt"] = meta
                    cands.append(cand)
            if fail is not None:
                fail.update(stage="propose", strategy=self.name, slot=k, turns=turns)
                failures.append(fail)
                st["proposer_failures"] = st.get("proposer_failures", 0) + 1
                st["last_failures"] = ([{"stage": "propose", "code": fail["code"], "message": fail["message"],
                                         "tactic": "reply"}] + st.get("last_failures", []))[:MAX_FAILURES_IN_PROMPT]
            if st.get("fatal"):
                break
        return cands, failures


def remember_failure(st: dict, cand: dict) -> None:
    """Keep the localized diagnostics of an evaluated candidate that failed, for the next prompt."""
    fail = cand.get("fail") or {}
    item = {"hash": cand["hash"], "tactic": cand.get("tactic"), "stage": fail.get("stage"), "code": fail.get("code"),
            "node": fail.get("node"), "message": fail.get("message", ""), "diagnostics": cand.get("diagnostics") or [],
            "ir": cand.get("ir")}
    st["last_failures"] = ([item] + st.get("last_failures", []))[:MAX_FAILURES_IN_PROMPT]
