"""The AWS CDK app built from a Plan.

Empty until the serving-path issue.
"""
