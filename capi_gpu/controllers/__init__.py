"""kopf handlers, kept thin: kwargs -> one service call -> status patch."""
