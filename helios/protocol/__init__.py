"""Protocol decoding (OpenAI Chat Completions, Anthropic Messages) into the normalized conversation."""


def decode_request(protocol: str, request: dict):
    if protocol == "openai":
        from .openai import decode_chat_request
    elif protocol == "anthropic":
        from .anthropic import decode_messages_request as decode_chat_request
    else:
        raise ValueError(f"unknown protocol {protocol!r} (openai or anthropic)")
    return decode_chat_request(request)
