from django.contrib import admin
from django.urls import include, path

from delayqueue_django.prometheus import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("shop/", include("shop.urls")),
    path("metrics/", metrics_view),
]
