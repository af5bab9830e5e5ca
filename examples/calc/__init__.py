"""The calc example: arithmetic word problems solved with a calculator tool."""
