"""A tool-using note reader: multi-turn agent rollouts, tools, world tasks and a user simulator."""
