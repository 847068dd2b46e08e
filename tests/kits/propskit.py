"""What the PUBLISH property tests share: hypothesis strategies for any properties."""

from __future__ import annotations

from hypothesis import strategies as st

from vox_mqtt.transport.publishprops import MessageProperties

# An MQTT string: any text without U+0000 (MQTT v5 1.5.4); surrogates cannot be encoded.
text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40)
# A response topic names no wildcard.
topic_text = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x00+#"), max_size=40
)


@st.composite
def message_properties(draw: st.DrawFn, *, subscriptions: bool = True) -> MessageProperties:
    """Any PUBLISH properties this client may send or receive, each present or not.

    subscriptions: with subscription identifiers (which only a broker sends).
    """

    def maybe() -> bool:
        return draw(st.booleans())

    identifiers = st.lists(st.integers(1, 268_435_455), max_size=3 if subscriptions else 0)
    return MessageProperties(
        payload_format_indicator=draw(st.sampled_from([0, 1])) if maybe() else None,
        message_expiry_interval=draw(st.integers(0, 2**32 - 1)) if maybe() else None,
        content_type=draw(text) if maybe() else None,
        response_topic=draw(topic_text) if maybe() else None,
        correlation_data=draw(st.binary(max_size=40)) if maybe() else None,
        subscription_identifiers=tuple(draw(identifiers)),
        user_properties=tuple(draw(st.lists(st.tuples(text, text), max_size=5))),
    )
