"""The text-to-SQL example: a LangGraph writer, checker and rewriter over a generated SQLite database."""
