#!/usr/bin/env bash
# A zero-code agent in bash: one chat call with curl whole, one streamed, against $OPENAI_BASE_URL.
set -euo pipefail
curl -sS --fail-with-body "$OPENAI_BASE_URL/chat/completions" \
  -H "Content-Type: application/json" -H "Authorization: Bearer $OPENAI_API_KEY" \
  -d "{\"model\": \"$FULGOR_MODEL\", \"max_tokens\": 16, \"messages\": [{\"role\": \"user\", \"content\": \"What is 2 + 3?\"}]}"
echo
curl -sS -N --fail-with-body "$OPENAI_BASE_URL/chat/completions" \
  -H "Content-Type: application/json" -H "Authorization: Bearer $OPENAI_API_KEY" \
  -d "{\"model\": \"$FULGOR_MODEL\", \"max_tokens\": 16, \"stream\": true, \"messages\": [{\"role\": \"user\", \"content\": \"What is 2 + 3?\"}]}" \
  | grep '^data:'
