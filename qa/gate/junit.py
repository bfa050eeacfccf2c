"""JUnit XML from a verdict: one testcase per task (one testsuite per candidate), so a CI dashboard
shows each task's decision."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from qa.files.verdict import TaskVerdict, Verdict
from quant.fileio import atomic_write_text

# XML 1.0 cannot carry most control characters, even escaped; task names come from user data.
XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """`text` with the characters XML 1.0 cannot carry replaced by U+FFFD."""
    return XML_BAD.sub("\ufffd", text)


def case_text(t: TaskVerdict) -> str:
    """The reason, every rule's line and the warnings of one task, one per line."""
    lines = [t.reason] + [f"{r.rule}{'' if r.decides else ' (reported)'}: {r.status}: {r.detail}" for r in t.rules]
    return "\n".join(lines + [f"warning: {w}" for w in t.warnings])


def _counts(tasks: list[TaskVerdict]) -> dict[str, str]:
    fails = sum(t.status == "fail" for t in tasks)
    incs = sum(t.status == "inconclusive" for t in tasks)
    return {"tests": str(len(tasks)), "failures": str(fails), "errors": str(incs)}


def _suite(suites: ET.Element, verdict: Verdict) -> None:
    """One testsuite (one testcase per task) of a candidate's verdict under `suites`."""
    suite = ET.SubElement(suites, "testsuite", name=xml_safe(f"qa gate: {verdict.candidate} vs {verdict.baseline}"),
                          **_counts(verdict.tasks), skipped="0")
    for t in verdict.tasks:
        case = ET.SubElement(suite, "testcase", classname="qa.gate", name=xml_safe(f"{t.task} [{t.metric}]"))
        if t.status == "fail":
            el = ET.SubElement(case, "failure", type=t.kind, message=xml_safe(t.reason))
        elif t.status == "inconclusive":
            el = ET.SubElement(case, "error", type=f"inconclusive:{t.kind}", message=xml_safe(t.reason))
        else:
            el = ET.SubElement(case, "system-out")
        el.text = xml_safe(case_text(t))


def _document(verdicts: list[Verdict]) -> str:
    suites = ET.Element("testsuites", name="accuracy-parity", **_counts([t for v in verdicts for t in v.tasks]))
    for v in verdicts:
        _suite(suites, v)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def junit_xml(verdict: Verdict) -> str:
    """JUnit XML, one testcase per task: fail -> <failure>, inconclusive -> <error type="inconclusive">
    (never a silent pass or skip in a CI dashboard)."""
    return _document([verdict])


def run_junit_xml(verdicts: list[Verdict]) -> str:
    """JUnit XML of a several-candidate run: one testsuite per candidate, one testcase per task."""
    return _document(verdicts)


def write_junit(path: Path, verdict: Verdict | list[Verdict]) -> None:
    """Write the JUnit XML report atomically (a list: one testsuite per candidate)."""
    atomic_write_text(path, run_junit_xml(verdict) if isinstance(verdict, list) else junit_xml(verdict))
