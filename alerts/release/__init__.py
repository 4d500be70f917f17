"""Release checks: is a new version as good as the one it replaces? Each module returns a
verdict; the alert is raised from it and the action runner (alerts/actions/runner.py) acts.

- `canary.py`: `CanaryController` runs a candidate beside the stable version on a share of
  traffic and steps it up, promotes it or rolls it back (arm against arm, and paired);
- `post_deploy.py`: `DeployAnalyzer` watches each deploy for a window against the previous
  version (the store's figures, and pairs) and rolls back a regression;
- `paired_checks.py`: both versions answering the SAME requests, checked pair by pair;
- `strata.py`: unpaired comparisons within strata of like requests (Mantel-Haenszel);
- `sequential.py`: the always-valid test (mSPRT) every check above updates.

The public names are exported by `infersight.alerts`.
"""
