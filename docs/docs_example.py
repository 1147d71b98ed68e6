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
