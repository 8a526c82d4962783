"""The docs stay true to the code and to each other: the generated config and metrics
references match what tools/gen_docs.py makes now from the config model and a live
registry, and every relative link in the README and docs/ lands on a file and, for an
``#anchor``, on a heading of it (GitHub's anchor rules)."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path
from types import ModuleType

from tests.conftest import ROOT
from tests.markdown import github_anchors, relative_links

# The README, docs/ and every other Markdown file of the repository (the chart's README,
# deploy/, bench/): none outside dot-directories (.venv, .cache, ...).
PAGES = sorted(p for p in ROOT.rglob("*.md") if not any(part.startswith(".") for part in p.relative_to(ROOT).parts))


def gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "tools" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_config_and_metrics_references_are_current() -> None:
    stale = {}
    for path, expected in gen_docs().generated().items():
        written = path.read_text()
        if written != expected:
            diff = difflib.unified_diff(written.splitlines(), expected.splitlines(), "file", "generated", lineterm="")
            stale[str(path.relative_to(ROOT))] = "\n".join(list(diff)[:40])
    assert stale == {}, "stale (run make docs):\n" + "\n".join(f"{p}:\n{d}" for p, d in stale.items())


def test_the_references_hold_every_config_key_and_metric_family() -> None:
    """The generated parts are not empty shells: a key of each section and the families
    the alerts read are in them."""
    config = (ROOT / "docs" / "config.md").read_text()
    for key in (
        "`bootstrap_servers`",
        "`client_identity`",
        "`queued.max.request.bytes`",
        "`listener.name.<listener>.max.connections`",
        "`topic_replication_factor`",
        "`seconds`",
    ):
        assert key in config, key
    metrics = (ROOT / "docs" / "metrics.md").read_text()
    for family in (
        "`kafka_admission_decisions_total`",
        "`kafka_admission_config_last_reload_successful`",
        "`kafka_admission_memory_pool_depleted_seconds_total`",
        "`kafka_admission_trio_tasks`",
        "`process_open_fds`",
    ):
        assert family in metrics, family


def test_a_stale_part_is_replaced_and_the_prose_around_it_kept() -> None:
    module = gen_docs()
    begin, end = module.begin_marker("config"), module.end_marker("config")
    page = f"# Config\n\nprose before\n\n{begin}\nold table\n{end}\n\nprose after\n"
    rewritten = module.with_part(page, "config", "| new | table |\n")
    assert rewritten == f"# Config\n\nprose before\n\n{begin}\n\n| new | table |\n\n{end}\n\nprose after\n"
    assert module.with_part(rewritten, "config", "| new | table |\n") == rewritten


def broken_links(pages: list[Path]) -> tuple[list[str], int]:
    """(each relative link that lands nowhere, with why; how many links were checked)."""
    broken, checked = [], 0
    for page in pages:
        for target in relative_links(page.read_text()):
            checked += 1
            path_part, _, anchor = target.partition("#")
            path = (page.parent / path_part).resolve() if path_part else page
            where = f"{page.name}: {target}"
            if not path.exists():
                broken.append(f"{where}: no such file")
            elif anchor and (path.suffix != ".md" or anchor not in github_anchors(path.read_text())):
                broken.append(f"{where}: no heading with that anchor")
    return broken, checked


def test_every_relative_link_in_the_readme_and_docs_lands() -> None:
    assert {ROOT / "README.md", ROOT / "docs" / "alerts.md", ROOT / "docs" / "config.md"} <= set(PAGES)
    broken, checked = broken_links(PAGES)
    assert broken == []
    assert checked > 40  # the README's map of docs/ and the pages' links to each other


def test_a_link_to_a_missing_file_or_heading_is_caught(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "alerts.md").write_text("# Alerts\n\n## KafkaAdmissionProxyDown\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "[ok](docs/alerts.md#kafkaadmissionproxydown) [gone](docs/policies.md) "
        "[moved](docs/alerts.md#kafkaadmissionproxyabsent) [here](#nowhere) [dir](docs)\n"
    )
    assert broken_links([readme]) == (
        [
            "README.md: docs/policies.md: no such file",
            "README.md: docs/alerts.md#kafkaadmissionproxyabsent: no heading with that anchor",
            "README.md: #nowhere: no heading with that anchor",
        ],
        5,
    )


def test_anchors_follow_github_rules() -> None:
    page = (
        "# Policies\n"
        "## Connection caps and the TLS cap (Kafka's ConnectionQuotas, KIP-1015)\n"
        "## Client identities toward brokers (`upstream.tls.client_identity`)\n"
        "```properties\n# a comment in code, not a heading\n```\n"
        "### Notes\n### Notes\n"
    )
    assert github_anchors(page) == {
        "policies",
        "connection-caps-and-the-tls-cap-kafkas-connectionquotas-kip-1015",
        "client-identities-toward-brokers-upstreamtlsclient_identity",
        "notes",
        "notes-1",
    }


def test_links_in_code_are_not_links() -> None:
    page = "[a](docs/a.md) `[b](b.md)` [c](https://example.com) [d](#d)\n```\n[e](e.md)\n```\n"
    assert relative_links(page) == ["docs/a.md", "#d"]
