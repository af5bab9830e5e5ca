"""The rooms example: book the right meeting room, by rules the seed prompt does not state."""
