"""The local dev kit: embedded servers, the supervised dev stack, the demo, chaos runs and the
bundled mail service. Nothing in the runtime (brain, hands, relay, store, bus) imports it."""
