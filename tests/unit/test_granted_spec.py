"""The spec a worker runs for a grant (:func:`granted_spec`): the grant's (environment values included), as the
offer's vetted user; for a job owned by this node, the owner's parsed spec itself (no parse of the grant)."""

from __future__ import annotations

from gpulayerd.app.worker.kept_offers import granted_spec
from gpulayerd.models.spec import job_spec_from_mapping
from gpulayerd.net.wire import Offer


def _spec(user: str, token: str = "s3cret") -> dict[str, object]:
    return {"command": ["python", "train.py"], "workdir": "/tmp", "user": user, "env": {"TOKEN": token}}


def test_the_owners_parsed_spec_is_run_as_it_is_and_a_peers_grant_is_parsed_as_the_vetted_user() -> None:
    offer = Offer(msg_id="m", owner="o", job_id="j", spec={"command": ["python", "train.py"], "workdir": "/tmp",
                                                               "user": "alice"}, lease_s=30.0)
    own = job_spec_from_mapping(_spec("alice"), base_dir="/")
    assert granted_spec(_spec("alice"), offer, None, own) is own  # (no parse)
    parsed = granted_spec(_spec("alice", "other"), offer, None)
    assert parsed is not own and parsed.env == {"TOKEN": "other"} and parsed.user == "alice"
    # A grant naming another user than the offer's: run as the vetted one, never the grant's (own or not)
    mallory = job_spec_from_mapping(_spec("mallory"), base_dir="/")
    assert granted_spec(_spec("mallory"), offer, None, mallory).user == "alice"
    assert granted_spec(None, offer, None, own).env == {}  # no grant spec: the offer's (no environment values)
