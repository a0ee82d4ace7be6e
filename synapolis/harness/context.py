"""A hook's answer and its context text: what each harness shows of it, counted its way, and the signals that fit."""

from __future__ import annotations

import json

from .conversation import CONTEXT_KINDS, EVENT_KINDS, OUTPUT_BUDGETS, SUMMARY_IDS


def answer(harness: str, event: str, context: str | None) -> dict:
    """The harness's own answer shape; {} when there is nothing to add."""
    kind = EVENT_KINDS.get(harness, {}).get(event)
    if harness == "copilot":
        from .copilot import answer as copilot_answer

        return copilot_answer(event, context)
    if not context or kind not in CONTEXT_KINDS:
        return {}
    return {"hookSpecificOutput": {"hookEventName": event, "additionalContext": context}}


def _utf16_units(text: str) -> int:
    if text.isascii():  # one unit a character, without loading the UTF-16 codec on a hook's call
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _escaped(text: str) -> str:
    """`text` as it stands inside the printed answer (run_bounded: json.dumps, ensure_ascii=False): a control
    character is six characters there (\\u0001), a quote, a backslash or a newline two."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text  # nothing to escape (the usual line): no encoder call
    return json.dumps(text, ensure_ascii=False)[1:-1]


def context_cost(harness: str, text: str) -> int:
    """What `text` costs as a hook's additionalContext in HARNESS, in the unit of OUTPUT_BUDGETS, counted as
    the harness receives it: JSON-escaped in the printed answer (4,500 control characters are 27,000 there).

    Every measure adds up character by character (JSON escapes each character on its own), so a text's cost
    is the sum of its parts' costs.
    """
    return printed_cost(harness, _escaped(text))


def printed_cost(harness: str, printed: str) -> int:
    """What printed text (the answer on stdout) costs in HARNESS's unit: Codex UTF-8 bytes, Claude Code
    UTF-16 code units (JavaScript's length), Gemini CLI UTF-16 code units once it escapes < and > as &lt; &gt;."""
    if harness == "codex":
        return len(printed.encode("utf-8", "surrogatepass"))
    if harness == "gemini-cli":
        return _utf16_units(printed) + 3 * (printed.count("<") + printed.count(">"))
    return _utf16_units(printed)


def context_room(harness: str, event: str) -> int:
    """The budget for one event's context: the harness's cap less the printed answer around it (the answer
    object with an empty context, and its newline), so that the whole answer stays within the cap."""
    envelope = json.dumps(answer(harness, event, "x"), ensure_ascii=False).replace('"x"', '""') + "\n"
    return OUTPUT_BUDGETS[harness] - printed_cost(harness, envelope)


def _signal_block(signal: dict) -> str:
    head = f"[signal {signal.get('id', '')[:12]} from {signal.get('sender')} to {signal.get('recipient')}" \
           f" · {signal.get('type')} · {signal.get('timestamp')}]"
    return f"{head}\n{signal.get('content', '')}"


def _shown_header(count: int) -> str:
    return f"{count} signal(s) from other agents (oldest first):"


def _summary(rest: list[dict], read_hint: str) -> str:
    ids = ", ".join((s.get("id") or "")[:12] for s in rest[:SUMMARY_IDS])
    more = f" and {len(rest) - SUMMARY_IDS} more" if len(rest) > SUMMARY_IDS else ""
    biggest = max(len(s.get("content") or "") for s in rest)
    return (f"{len(rest)} more signal(s) not shown here: they do not fit in one hook answer of this harness "
            f"(the largest has {biggest} characters). Ids: {ids}{more}. {read_hint}")


def _worst_summary(read_hint: str) -> str:
    # the longest `_summary` can be: ids are 12 hex digits, and no count comes near these numbers
    ids = ", ".join(["f" * 12] * SUMMARY_IDS)
    return (f"{10 ** 10} more signal(s) not shown here: they do not fit in one hook answer of this harness "
            f"(the largest has {10 ** 12} characters). Ids: {ids} and {10 ** 10} more. {read_hint}")


class ContextBudget:
    """Decides which signals fit one answer of a harness, reserving room for the summary at its largest.

    `fits(chosen, candidate)` is the test the store's drain applies while it takes signals oldest
    first, so that exactly the signals shown are the ones marked delivered.
    """

    def __init__(self, harness: str, room: int, preamble: list[str], ack_hint: str, read_hint: str):
        self.harness, self.room = harness, room
        cost = self.cost
        separators = cost("\n\n") * (len(preamble) + 3)
        self.fixed = (sum(cost(p) for p in preamble) + cost(_shown_header(10 ** 10)) + cost(ack_hint)
                      + cost(_worst_summary(read_hint)) + separators)
        self._blocks: dict[str, int] = {}

    def cost(self, text: str) -> int:
        return context_cost(self.harness, text)

    def block_cost(self, signal: dict) -> int:
        key = signal.get("id") or id(signal)
        if key not in self._blocks:
            self._blocks[key] = self.cost(_signal_block(signal)) + self.cost("\n\n")
        return self._blocks[key]

    def fits(self, chosen: list[dict], candidate: dict) -> bool:
        used = self.fixed + sum(self.block_cost(s) for s in chosen)
        return used + self.block_cost(candidate) <= self.room


def render_context(preamble: list[str], shown: list[dict], rest: list[dict], ack_hint: str, read_hint: str) -> str:
    """The additionalContext text: the preamble, the signals shown (whole, oldest first), and a summary
    by id and size of the ones `rest` that wait, with the command that reads them."""
    parts = list(preamble)
    if shown:
        parts.append(_shown_header(len(shown)))
        parts.extend(_signal_block(s) for s in shown)
    if rest:
        parts.append(_summary(rest, read_hint))
    if shown:
        parts.append(ack_hint)
    return "\n\n".join(parts)
