"""The doctor's report: one markdown file meant to be pasted into an issue.

Sections: the overall result and the command; versions; devices; one table row per part (its result
against its tolerances); each part's measurements; the errors in full. Numbers are printed with 4
significant digits (``f"{x:.4g}"``).
"""

from __future__ import annotations

from .plan import ERROR, FAIL, PASS, SKIPPED, Verdict

#: probe keys shown under "Versions", in this order
VERSION_KEYS = ("policyzoo", "python", "torch", "cuda", "transformers", "accelerate", "peft", "deepspeed",
                "pydantic", "vllm", "trl")
#: result keys never shown among the measurements (shown elsewhere, or too long)
HIDDEN = {"error", "skipped", "devices", "wall_s", *VERSION_KEYS}


def fmt(v) -> str:
    """A value as the report prints it: floats to 4 significant digits, None as ``-``."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _header(meta: dict, verdicts: list[Verdict]) -> list[str]:
    counts = {s: sum(v.status == s for v in verdicts) for s in (PASS, FAIL, ERROR, SKIPPED)}
    return [f"# policyzoo doctor --gpu: {meta['overall']}", "",
            f"- command: `{meta['command']}`",
            f"- device: {meta['device']}; wall time {meta['wall_s']:.0f} s (at most {meta['bound_s']} s: each part "
            f"its own process and timeout; the plan's limit {meta['budget_s']} s)",
            "- parts: " + ", ".join(f"{n} {s}" for s, n in counts.items()), ""]


def _versions(probe: dict) -> list[str]:
    if "error" in probe or "skipped" in probe:
        return ["## Versions", "", f"(probe: {probe.get('error') or probe.get('skipped')})", ""]
    rows = [f"| {k} | {fmt(probe.get(k))} |" for k in VERSION_KEYS]
    return ["## Versions", "", "| package | version |", "|---|---|", *rows, ""]


def _devices(probe: dict) -> list[str]:
    devs = probe.get("devices") or []
    if not devs:
        return ["## Devices", "", "no CUDA GPU visible to the parts (CPU run)", ""]
    rows = [f"| {d['index']} | {d['name']} | {d['memory_gib']} | {d['capability']} |" for d in devs]
    return ["## Devices", "", f"bf16 supported: {probe.get('bf16')}", "",
            "| GPU | name | memory GiB | compute capability |", "|---|---|---|---|", *rows, ""]


def _parts(verdicts: list[Verdict], results: dict[str, dict]) -> list[str]:
    lines = ["## Parts", "", "| part | result | wall s | against the tolerances |", "|---|---|---|---|"]
    for v in verdicts:
        detail = "; ".join(c.text() for c in v.checks) or (v.reason.splitlines() or ["-"])[0][:160] or "-"
        lines.append(f"| {v.part.name} | {v.status} | {fmt(results[v.part.name].get('wall_s'))} | {detail} |")
    return lines + [""]


def _measurements(verdicts: list[Verdict], results: dict[str, dict]) -> list[str]:
    lines = ["## Measurements", ""]
    for v in verdicts:
        shown = {k: x for k, x in results[v.part.name].items() if k not in HIDDEN}
        if v.status in (ERROR, SKIPPED) or not shown:
            continue
        lines += [f"### {v.part.name}", "", v.part.what, ""]
        lines += [f"- {k}: {fmt(x)}" for k, x in shown.items()]
        lines += [f"- tolerance: {c.limit.key} <= {c.limit.limit:g} ({c.limit.source})" for c in v.checks] + [""]
    return lines


def _errors(verdicts: list[Verdict]) -> list[str]:
    errs = [v for v in verdicts if v.status == ERROR]
    if not errs:
        return []
    lines = ["## Errors", ""]
    for v in errs:
        lines += [f"### {v.part.name}", "", "```", v.reason.strip(), "```", ""]
    return lines


def render(meta: dict, verdicts: list[Verdict], results: dict[str, dict]) -> str:
    """The report for ``meta`` (``command``, ``device``, ``wall_s``, ``bound_s``: the sum of the plan's
    timeouts, ``budget_s``, ``overall``), the
    parts' verdicts so far and their raw results (``results[part]``, ``probe`` giving versions and
    devices when it ran)."""
    probe = results.get("probe", {"skipped": "not run"})
    body = _header(meta, verdicts) + _versions(probe) + _devices(probe) + _parts(verdicts, results)
    return "\n".join(body + _measurements(verdicts, results) + _errors(verdicts))
