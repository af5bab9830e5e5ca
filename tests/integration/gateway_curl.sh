#!/usr/bin/env bash
# A zero-code agent: two chat calls with curl, one whole and one streamed, against $OPENAI_BASE_URL.
set -euo pipefail
curl -sS --fail-with-body "$OPENAI_BASE_URL/chat/completions" \
  -H "Content-Type: application/json" -H "Authorization: Bearer ${OPENAI_API_KEY:-unused}" \
  -d '{"model": "m", "messages": [{"role": "user", "content": "hello"}]}'
echo
curl -sS -N --fail-with-body "$OPENAI_BASE_URL/chat/completions" \
  -H "Content-Type: application/json" -H "Authorization: Bearer ${OPENAI_API_KEY:-unused}" \
  -d '{"model": "m", "messages": [{"role": "user", "content": "stream"}], "stream": true}' | grep '^data:'
