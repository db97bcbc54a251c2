"""The network and the capacity provider of a plan's Lambda Managed Instances.

A capacity provider runs its EC2 instances in the stack's own subnets, so a plan with managed
functions (`plan.traffic`, policy "managed") gets a VPC: isolated subnets in up to three
Availability Zones (LMI launches three instances by default, one per zone), no NAT gateway and
no internet route. The handlers reach AWS only through endpoints: S3 (every role reads its
weights and the request's tensors: a gateway endpoint, free), Lambda (a direct gate invokes its
experts) and CloudWatch Logs (the functions' log groups). The security group lets the
instances out on HTTPS only, and nothing in. The provider allows exactly the plan's instance
type; each managed function attaches to it with `ground.managed`'s sizing (2 GiB per vCPU,
one request per environment) and its environment count as both the minimum and the maximum,
the fixed pool the planner simulated.
"""

from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from ground.managed import MAX_CONCURRENCY, MEMORY_GIB_PER_VCPU
from ground.plan import FunctionCapacity

__all__ = ["ManagedInstances"]

_AZS = 3  # LMI's default instances, one per zone


class ManagedInstances(Construct):
    """The VPC, its endpoints and the capacity provider of the stack's managed functions."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        instance_type: str,
        architecture: lambda_.Architecture,
    ) -> None:
        super().__init__(scope, id_)
        self.functions: list[lambda_.IFunction] = []  # attached, in order
        self.flow_logs = logs.LogGroup(self, "FlowLogs", retention=logs.RetentionDays.ONE_MONTH)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=_AZS,
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="Instances", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED
                )
            ],
            flow_logs={
                "All": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_logs)
                )
            },
        )
        group = ec2.SecurityGroup(
            self,
            "Instances",
            vpc=self.vpc,
            description="moelambda managed instances - HTTPS out, nothing in",
            allow_all_outbound=False,
        )
        # No route leaves the subnets but through the endpoints, so HTTPS to any address
        # reaches only them (S3's gateway endpoint has no security group to name).
        group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to the endpoints")
        endpoints = ec2.SecurityGroup(
            self,
            "Endpoints",
            vpc=self.vpc,
            description="moelambda endpoints - HTTPS from the managed instances only",
            allow_all_outbound=False,
        )
        endpoints.add_ingress_rule(group, ec2.Port.tcp(443), "HTTPS from the managed instances")
        self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        for name, service in (
            ("Lambda", ec2.InterfaceVpcEndpointAwsService.LAMBDA_),
            ("Logs", ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS),
        ):
            self.vpc.add_interface_endpoint(
                name, service=service, private_dns_enabled=True, security_groups=[endpoints],
                open=False,
            )  # fmt: skip
        self.provider = lambda_.CapacityProvider(
            self,
            "Provider",
            subnets=self.vpc.isolated_subnets,
            security_groups=[group],
            architectures=[architecture],
            instance_type_filter=lambda_.InstanceTypeFilter.allow(
                [ec2.InstanceType(instance_type)]
            ),
        )

    def attach(self, fn: lambda_.IFunction, capacity: FunctionCapacity) -> None:
        """Run `fn` on the provider with the plan's fixed pool of environments."""
        n = capacity.managed_environments
        self.functions.append(fn)
        self.provider.add_function(
            fn,
            execution_environment_memory_gib_per_v_cpu=MEMORY_GIB_PER_VCPU,
            per_execution_environment_max_concurrency=MAX_CONCURRENCY,
            latest_published_scaling_config=lambda_.LatestPublishedScalingConfig(
                min_execution_environments=n, max_execution_environments=n
            ),
        )
