"""A Prefect automation that tells a team when a pipeline fails: every flow run of mclpipe's pipeline flows that
ends Failed or Crashed sends one notification (a Slack incoming webhook, or any webhook) naming the run, its state
message and its page in the Prefect UI. docs/ui.md shows the same in the UI, step by step.

    python -m flows.alerts --webhook-url https://hooks.slack.com/services/... --slack   # PREFECT_API_URL set

Prefect 3.8.8 API: prefect.automations.Automation, prefect.events.schemas.automations.EventTrigger,
prefect.events.actions.SendNotification, prefect.blocks.notifications.{SlackWebhook,CustomWebhookNotificationBlock}.
"""
from __future__ import annotations

import argparse
from datetime import timedelta
from uuid import UUID

from prefect.automations import Automation
from prefect.blocks.notifications import CustomWebhookNotificationBlock, SlackWebhook
from prefect.events.actions import SendNotification
from prefect.events.schemas.automations import EventTrigger, Posture

PIPELINE_FLOWS = ["mcl-pipeline", "mcl-sweep"]  # the one pipeline flow (every modality) and the sweep
SUBJECT = "mclpipe: {{ flow_run.name }} {{ flow_run.state.name }}"
# Jinja over the event's related objects (flow, flow_run); ui_url is the server's filter for a run's page.
BODY = ("Flow run {{ flow_run.name }} of {{ flow.name }} ended {{ flow_run.state.name }}: "
        "{{ flow_run.state.message }}\n{{ flow_run|ui_url }}\n"
        "Finished stages are kept: press Retry on that page (or `mclpipe resume`) once the cause is fixed.")


def failure_alert(*, block_document_id: UUID, name: str = "mclpipe pipeline failed") -> Automation:
    """The automation: on a flow run of a pipeline flow entering Failed or Crashed, send the notification block."""
    return Automation(
        name=name, description="Notify when an mclpipe pipeline's flow run fails or crashes (flows/alerts.py)",
        trigger=EventTrigger(
            expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed"},
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={"prefect.resource.role": "flow", "prefect.resource.name": PIPELINE_FLOWS},
            posture=Posture.Reactive, threshold=1, within=timedelta(0)),
        actions=[SendNotification(block_document_id=block_document_id, subject=SUBJECT, body=BODY)])


def create_failure_alert(*, webhook_url: str, slack: bool = False, name: str = "mclpipe pipeline failed") -> UUID:
    """Save the notification block (a Slack webhook, or a JSON POST of ``{"text": subject + body}`` to any URL)
    and create the automation on the Prefect server of PREFECT_API_URL; returns the automation's id."""
    if slack:
        block = SlackWebhook(url=webhook_url)
    else:
        block = CustomWebhookNotificationBlock(name=name, url=webhook_url,
                                               json_data={"text": "{{subject}}\n{{body}}"})
    block_id = block.save("mclpipe-failure-" + ("slack" if slack else "webhook"), overwrite=True)
    return failure_alert(block_document_id=block_id, name=name).create().id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--webhook-url", required=True, help="Slack incoming-webhook URL, or any URL taking a POST")
    parser.add_argument("--slack", action="store_true", help="the URL is a Slack incoming webhook")
    parser.add_argument("--name", default="mclpipe pipeline failed", help="the automation's name")
    args = parser.parse_args()
    automation_id = create_failure_alert(webhook_url=args.webhook_url, slack=args.slack, name=args.name)
    print(f"automation {automation_id} created: `prefect automation inspect --id {automation_id}` shows it")


if __name__ == "__main__":
    main()
