"""Team metric labels: verbatim, bounded, reserved names told apart."""

from __future__ import annotations

from fairq_server.tenancy.team_labels import TeamLabels


def test_teams_past_the_cap_share_other_and_known_ones_keep_their_label() -> None:
    labels = TeamLabels(cap=2)
    assert labels.label("a") == "a"
    assert labels.label("b") == "b"
    assert labels.label("c") == "other"
    assert labels.label("a") == "a"
    assert labels.label(None) == "none"
    assert labels.label("other") == "other"  # past the cap too: "team:other" is not admitted


def test_a_team_named_like_a_reserved_label_is_told_apart() -> None:
    labels = TeamLabels()
    assert labels.label("none") == "team:none"
    assert labels.label("other") == "team:other"
    assert labels.label("ééé sk-123") == "ééé sk-123"
