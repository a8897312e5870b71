"""What the rules need to know before they change anything, computed once and shared.

The analyses read the original trees only: which values are FSDP1 models and
where they come from (models), which code already serves FSDP1 and FSDP2
side by side (versions), and which constructors and uses convert together
across the whole program (program). Rules ask them; they never ask rules.
"""
