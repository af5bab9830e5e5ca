"""The calc task through a CrewAI crew of two agents: a solver with the calculator, and a reporter."""
