from django.db import models


class Product(models.Model):
    """A row the scenario changes: ``stock`` is the effect, ``version`` the optimistic version."""

    stock = models.IntegerField()
    version = models.IntegerField(default=1)
