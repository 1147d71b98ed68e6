"""The order workflow of docs/usermachine.md: a plain transitions declaration, and its fix."""

OrderFlow = {
    "states": ["cart", "placed", "paid", "shipped", "delivered", "cancelled", "held", "disputed"],
    "initial": "cart",
    "final": ["delivered", "cancelled"],
    "transitions": [
        ["place", "cart", "placed"],
        {"trigger": "pay", "source": "placed", "dest": "paid", "conditions": "card_ok"},
        ["cancel", ["cart", "placed"], "cancelled"],
        ["ship", "paid", "shipped"],
        ["deliver", "shipped", "delivered"],
        ["hold", "paid", "held"],
        ["dispute", "held", "disputed"],
        ["answer", "disputed", "held"],
    ],
}

#: The same workflow, with a way out of a held order: release it, or refund it.
FixedOrderFlow = {
    **OrderFlow,
    "transitions": [
        *OrderFlow["transitions"],
        ["release", "held", "paid"],
        ["refund", "disputed", "cancelled"],
    ],
}

#: A circuit breaker: ``fail`` keeps it closed below three failures and opens it at three. Its
#: guards are methods of the model, :class:`Breaker`, which counts the failures.
CircuitBreaker = {
    "states": ["closed", "open", "half_open"],
    "initial": "closed",
    "transitions": [
        {
            "trigger": "fail",
            "source": "closed",
            "dest": "closed",
            "conditions": "below_limit",
            "after": "count",
        },
        {"trigger": "fail", "source": "closed", "dest": "open", "conditions": "at_limit"},
        ["timeout", "open", "half_open"],
        {"trigger": "succeed", "source": "half_open", "dest": "closed", "after": "reset"},
        ["fail", "half_open", "open"],
    ],
}


class Breaker:
    """The circuit breaker's model: the failures counted, and the guards that read them."""

    def __init__(self) -> None:
        self.failures = 0

    def below_limit(self) -> bool:
        return self.failures < 3

    def at_limit(self) -> bool:
        return self.failures >= 3

    def count(self) -> None:
        self.failures += 1

    def reset(self) -> None:
        self.failures = 0


class WrongBreaker(Breaker):
    """The same model with a slip: ``<=`` for ``<``, so at three failures both guards hold."""

    def below_limit(self) -> bool:
        return self.failures <= 3
