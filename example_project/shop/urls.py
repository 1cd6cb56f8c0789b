from django.urls import path

from shop import views

urlpatterns = [
    path("", views.home, name="home"),
    path("orders/", views.create_order, name="create-order"),
    path("orders/<int:order_id>/pay/", views.pay_order, name="pay-order"),
]
