"""The seed example: send an approved notice to each customer, then summarise.

Run it with ``baton brain --app baton.examples.notices:app`` and ``baton hands --app
baton.examples.notices:app``; the scripted model sends one ``send_email`` per address found in
the user's message, in one response, then names each recipient's outcome.
"""

from baton import Agent, App
from baton.hands.tools import http_get, send_email

notices = Agent(
    name="notices",
    compat=1,
    instructions=(
        "You send an approved notice to each customer named in the request, one e-mail per "
        "recipient, then summarise the outcome for each recipient."
    ),
    model="scripted",
    tools=("send_email",),
)

app = App(agents=[notices], tools=[send_email, http_get])
