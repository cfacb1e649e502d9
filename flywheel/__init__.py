"""The flywheel stage: production weak signals choose what experts label; expert labels become the next round's
preference pairs (DESIGN.md "The flywheel", principle 4). Weak signals select, they never reward.

Modules: schema (event rows), store (DuckDB / PostgreSQL), simulate (traffic simulator), judge (per-turn judge
scores cached by content hash), select (disagreement selection), quality (weak-signal agreement with experts),
scrub (PII), annotation (Label Studio round trip); imported pairs go through data.decontamination (per user turn).
"""
