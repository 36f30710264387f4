"""schemathesis against /openapi.json: generated requests (valid and invalid) for every
operation, with a valid key, on the live stack. No answer may be a 5xx, and every answer
must match the schema the API publishes for it."""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

pytestmark = [pytest.mark.broker]

EXAMPLES = {GenerationMode.POSITIVE: 6, GenerationMode.NEGATIVE: 4}
# the chat body is the largest schema (messages of three shapes, tools, response formats):
# few of its generated bodies are valid as a whole, so it gets more examples
MORE = {"POST /v1/chat/completions": 3}


@pytest.mark.parametrize("mode", list(EXAMPLES), ids=lambda m: m.value)
def test_every_operation_keeps_its_schema_and_never_5xx(stack, mode):
    if stack.store.dialect != "sqlite":
        pytest.skip("one backend is enough for the schema fuzz")
    key = stack.new_key("fuzz")
    schema = schemathesis.openapi.from_url(stack.url + "/openapi.json")
    headers = {"Authorization": f"Bearer {key.token}"}
    ran, statuses = [], Counter()
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(max_examples=EXAMPLES[mode] * MORE.get(operation.label, 1), deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(mode, headers=headers))
        def run(case):
            response = case.call(base_url=stack.url, headers=headers, timeout=60)
            statuses[(operation.label, response.status_code)] += 1
            case.validate_response(response, checks=[not_a_server_error,
                                                     response_schema_conformance],
                                   headers=headers)

        try:
            run()
        except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
            assert mode is GenerationMode.NEGATIVE
            continue
        ran.append(operation.label)
    assert "POST /v1/chat/completions" in ran and "GET /v1/requests/{request_id}" in ran
    assert {"POST /v1/completions", "GET /v1/models/{model_id}", "DELETE /v1/files/{file_id}",
            "GET /v1/files", "POST /v1/messages", "POST /v1/messages/count_tokens"} <= set(ran), ran
    if mode is GenerationMode.POSITIVE:  # valid input reached the real work, not only errors
        assert statuses[("POST /v1/requests", 202)] and statuses[("POST /v1/chat/completions", 200)], statuses
    else:
        assert all(status < 500 for _, status in statuses) and statuses[("POST /v1/requests", 400)]
