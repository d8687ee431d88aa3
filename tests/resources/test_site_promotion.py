"""`[tpu.promotion]`: soak time and freeze windows
load, and a bad window names file, line and value."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from resources.errors import FileFormatError
from resources.site.load import load_site
from resources.site.schema import SiteConfig
from tests.support.site_text import GOOD

POLICY = """
[tpu.promotion]
soak_minutes = 120

[[tpu.promotion.freeze]]
name = "q4-campaign"
start = 2026-12-20T00:00:00Z
end = "2027-01-04T00:00:00+00:00"

[[tpu.promotion.freeze]]
name = "weekend"
cron = "0 18 * * fri"
duration_minutes = 3780
"""


def load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "site.toml"
    path.write_text(GOOD + text)
    return load_site(path)


def error_for(tmp_path: Path, text: str) -> FileFormatError:
    with pytest.raises(FileFormatError) as info:
        load(tmp_path, text)
    return info.value


def line_of(text: str, needle: str) -> int:
    return (GOOD + text).splitlines().index(needle) + 1


def test_policy_loads_both_kinds_of_window_in_utc(tmp_path: Path) -> None:
    promotion = load(tmp_path, POLICY).tpu.promotion
    assert promotion.soak_minutes == 120
    campaign, weekend = promotion.freeze
    assert campaign.start == datetime(2026, 12, 20, tzinfo=UTC) and campaign.end == datetime(
        2027, 1, 4, tzinfo=UTC
    )
    assert weekend.cron == "0 18 * * fri" and weekend.duration_minutes == 3780
    assert load(tmp_path, "").tpu.promotion.freeze == []  # no table: no soak, no freeze


@pytest.mark.parametrize(
    ("bad", "good", "says"),
    [
        (
            'cron = "0 25 * * fri"',
            'cron = "0 18 * * fri"',
            (
                "[[tpu.promotion.freeze]] #2 cron: cron '0 25 * * fri' is not a cron "
                "expression (Bad hour)"
            ),
        ),
        (
            'cron = "every friday"',
            'cron = "0 18 * * fri"',
            "cron 'every friday' is not a cron expression",
        ),
        (
            "start = 2026-12-20T00:00:00",
            "start = 2026-12-20T00:00:00Z",
            "start: timestamp 2026-12-20T00:00:00 has no UTC offset",
        ),
        (
            'end = "2026-12-19T00:00:00Z"',
            'end = "2027-01-04T00:00:00+00:00"',
            "end 2026-12-19T00:00:00+00:00 is not after start 2026-12-20T00:00:00+00:00",
        ),
        (
            'end = "next tuesday"',
            'end = "2027-01-04T00:00:00+00:00"',
            "end: Input should be a valid datetime",
        ),
        (
            "duration_minutes = 0",
            "duration_minutes = 3780",
            "duration_minutes: Input should be greater than 0 (got 0)",
        ),
        (
            "soak_minutes = -5",
            "soak_minutes = 120",
            "[tpu.promotion] soak_minutes: Input should be greater than or equal to 0 (got -5)",
        ),
    ],
)
def test_a_bad_window_names_file_line_and_value(
    tmp_path: Path, bad: str, good: str, says: str
) -> None:
    text = POLICY.replace(good, bad)
    err = error_for(tmp_path, text)
    assert err.path == str(tmp_path / "site.toml") and err.line == line_of(text, bad), str(err)
    assert says in str(err), str(err)
    if "valid datetime" in says:
        assert "'next tuesday'" in str(err)  # the value, as written


def test_a_window_that_is_neither_or_both_kinds_points_at_its_table(tmp_path: Path) -> None:
    half = POLICY.replace("duration_minutes = 3780\n", "")
    err = error_for(tmp_path, half)
    assert err.line == line_of(half, 'cron = "0 18 * * fri"')
    assert (
        "freeze 'weekend': a recurring window needs both cron and duration_minutes "
        "(duration_minutes is missing)"
    ) in str(err)
    both = POLICY.replace(
        'cron = "0 18 * * fri"', 'cron = "0 18 * * fri"\nstart = 2026-12-20T00:00:00Z'
    )
    err = error_for(tmp_path, both)
    assert err.line == line_of(both, 'cron = "0 18 * * fri"')
    assert "mixes start/end with cron/duration_minutes" in str(err)
    twice = POLICY.replace('name = "weekend"', 'name = "q4-campaign"')
    err = error_for(tmp_path, twice)
    assert err.line == len((GOOD + twice).splitlines()) - 2  # the second window's name
    assert (
        "[[tpu.promotion.freeze]] #2 name: freeze name 'q4-campaign' appears more than once"
        in str(err)
    )
    lone = POLICY.replace('end = "2027-01-04T00:00:00+00:00"\n', "")
    err = error_for(tmp_path, lone)
    assert err.line == line_of(
        lone, "start = 2026-12-20T00:00:00Z"
    ) and "set start and end (UTC)" in str(err)


def test_the_example_site_files_policy_means_what_its_comments_say() -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "site.example.toml"
    promotion = SiteConfig.model_validate(
        tomllib.loads(example.read_text(encoding="utf-8"))
    ).tpu.promotion
    assert promotion.soak_minutes == 60 and [w.name for w in promotion.freeze] == [
        "weekend",
        "q4-campaign",
    ]
    weekend, campaign = promotion.freeze
    friday = datetime(2026, 12, 4, 18, 0, tzinfo=UTC)
    # "Friday 18:00 to Monday 08:00 UTC"
    assert weekend.open_until(friday) == datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
    assert weekend.open_until(friday - timedelta(minutes=1)) is None
    assert campaign.open_until(datetime(2026, 12, 25, tzinfo=UTC)) == datetime(
        2027, 1, 4, tzinfo=UTC
    )
