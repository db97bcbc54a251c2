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

A plan with `managed_target_utilisation` scales the provider's instances instead of holding a
fixed pool: a target-tracking policy keeps the instances' average utilisation at that share,
on GPU utilisation for a GPU pool (`TrafficPlan.accelerated`) and on CPU utilisation
otherwise, and `MaxVCpuCount` caps the pool at the planned instances times the type's vCPUs
(from the calibration's `ec2_instance_prices`; without the type there, no cap is invented).
CloudFormation's `CapacityProviderScalingConfig` is `{"MaxVCpuCount": int (2-15000),
"ScalingMode": "Auto" | "Manual", "ScalingPolicies": [{"PredefinedMetricType":
"LambdaCapacityProviderAverageCPUUtilization" | "LambdaCapacityProviderAverageGPUUtilization",
"TargetValue": 0-100}]}` (https://docs.aws.amazon.com/AWSCloudFormation/latest/
TemplateReference/aws-properties-lambda-capacityprovider-capacityproviderscalingconfig.html and
.../aws-properties-lambda-capacityprovider-targettrackingscalingpolicy.html; cfn-lint 1.58.0's
schema has both metrics). aws-cdk-lib 2.275.0, which this repo pins, names only the CPU metric
(`TargetTrackingScalingPolicy.cpu_utilization`; `gpu_utilization` came with 2.278.0), so the
mode and the policy are written as property overrides of the provider's CfnCapacityProvider.

A GPU-backed function (`FunctionCapacity.accelerator_memory_gib`) gets `AcceleratorConfig`
`{"AcceleratorMemorySize": GiB}` (3, 6, 12, 16, 24 or 48; Image package on x86_64 only:
https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/
aws-properties-lambda-function-acceleratorconfig.html, https://docs.aws.amazon.com/
serverless-application-model/latest/developerguide/sam-property-function-acceleratorconfig.html;
`ground.plan.Plan` checks both). aws-cdk-lib added `acceleratorConfig` in 2.278.0, so it is a
property override of the function's CfnFunction too; cfn-lint 1.58.0's AWS::Lambda::Function
schema predates the property and reports it as E3002 (additional property), which the
function's own `cfn-lint` Metadata ignores (tests/cdk/test_gpu_stack.py checks that this is
the only error the ignore hides). aws-cdk-lib's synth-time template validation (CloudFormation
Validate, which `cdk synth` and `moelambda synth` run) reads the same schema and would print the
same finding as a warning, F3002; the function acknowledges it (`ACCELERATOR_SCHEMA_RULE`, with
its reason in the cloud assembly's metadata), so synth prints none and the assembly's
validation-report.json lists none (tests/cdk/test_gpu_stack.py).
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from ground.errors import UsageError
from ground.managed import MAX_CONCURRENCY, MEMORY_GIB_PER_VCPU
from ground.plan import FunctionCapacity, TrafficPlan

__all__ = ["ManagedInstances"]

_AZS = 3  # LMI's default instances, one per zone
_METRIC = {
    False: "LambdaCapacityProviderAverageCPUUtilization",
    True: "LambdaCapacityProviderAverageGPUUtilization",
}  # by TrafficPlan.accelerated
# The synth-time validation's rule for a property its schema lacks, and why it is acknowledged.
ACCELERATOR_SCHEMA_RULE = "CloudFormation-Validate::F3002"
ACCELERATOR_SCHEMA_REASON = (
    "AcceleratorConfig is a documented AWS::Lambda::Function property (CloudFormation template "
    "reference, aws-properties-lambda-function-acceleratorconfig) that this validator's schema "
    "predates; aws-cdk-lib 2.278.0 types it, 2.275.0 (pinned) writes it as an override."
)
_CDK_MIN_VCPUS = 12  # aws-cdk-lib's CapacityProvider refuses a smaller maxVCpuCount


class ManagedInstances(Construct):
    """The VPC, its endpoints and the capacity provider of the stack's managed functions."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        traffic: TrafficPlan,
        architecture: lambda_.Architecture,
        instance_vcpus: int | None,
    ) -> None:
        super().__init__(scope, id_)
        assert traffic.managed_instance_type is not None  # TrafficPlan names the provider
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
        target = traffic.managed_target_utilisation
        max_vcpus = (
            traffic.managed_instances * instance_vcpus
            if target is not None and instance_vcpus is not None
            else None
        )
        if max_vcpus is not None and max_vcpus < _CDK_MIN_VCPUS:
            raise UsageError(
                f"the plan scales at most {traffic.managed_instances} "
                f"{traffic.managed_instance_type} instances, {max_vcpus} vCPUs: under the "
                f"{_CDK_MIN_VCPUS} that aws-cdk-lib's CapacityProvider takes as MaxVCpuCount.",
                f"plan again with at least {-(-_CDK_MIN_VCPUS // instance_vcpus)} instances "
                "of that type, or with a larger type.",
            )
        self.provider = lambda_.CapacityProvider(
            self,
            "Provider",
            subnets=self.vpc.isolated_subnets,
            security_groups=[group],
            architectures=[architecture],
            instance_type_filter=lambda_.InstanceTypeFilter.allow(
                [ec2.InstanceType(traffic.managed_instance_type)]
            ),
            max_v_cpu_count=max_vcpus,
        )
        if target is not None:
            # Overrides: aws-cdk-lib 2.275.0 cannot name the GPU metric (module docstring).
            cfn = self.provider.node.default_child
            assert isinstance(cfn, lambda_.CfnCapacityProvider)
            cfn.add_property_override("CapacityProviderScalingConfig.ScalingMode", "Manual")
            cfn.add_property_override(
                "CapacityProviderScalingConfig.ScalingPolicies",
                [
                    {
                        "PredefinedMetricType": _METRIC[traffic.accelerated],
                        "TargetValue": round(100 * target, 6),  # a percentage
                    }
                ],
            )

    def attach(self, fn: lambda_.Function, capacity: FunctionCapacity) -> None:
        """Run `fn` on the provider with the plan's pool of environments, and its GPU memory
        when the plan gives it one."""
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
        if capacity.accelerator_memory_gib is not None:
            cfn = fn.node.default_child
            assert isinstance(cfn, lambda_.CfnFunction)
            # aws-cdk-lib 2.275.0 predates AcceleratorConfig (added in 2.278.0): an override.
            cfn.add_property_override(
                "AcceleratorConfig", {"AcceleratorMemorySize": capacity.accelerator_memory_gib}
            )
            # cfn-lint 1.58.0's schema lacks AcceleratorConfig and reports it as an additional
            # property (E3002); ignored on this function only (module docstring).
            cfn.add_metadata("cfn-lint", {"config": {"ignore_checks": ["E3002"]}})
            # aws-cdk-lib's own synth-time validation (CloudFormation Validate 1.12.1) uses the
            # same schema and warns F3002 for the same property: acknowledged on this function
            # only, for the same reason, so synth prints no warning about it.
            Validations.of(cfn).acknowledge(
                Acknowledgment(id=ACCELERATOR_SCHEMA_RULE, reason=ACCELERATOR_SCHEMA_REASON)
            )
