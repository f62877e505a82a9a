"""Safety judges (docs/safety.md): guard models that judge requests and answers under a `policy`.

formats.py writes each guard model's prompt and reads its verdict; judge.py asks the judges through the
gateway; audit.py keeps one record per verdict in audit.db. The `policy` setting itself is parsed by
app/core/policy.py (pure, so settings check it when they load).
"""
