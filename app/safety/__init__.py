"""Safety judges (docs/safety.md): guard models that judge requests and answers under a `policy`.

formats.py writes each guard model's prompt and reads its verdict; policy.py is the `policy` setting;
judge.py asks the judges through the gateway; audit.py keeps one record per verdict in audit.db.
"""
