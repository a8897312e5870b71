"""Rules for what training and checkpoint code does with a wrapped model (MF2xx), in code order."""
