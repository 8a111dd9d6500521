from django.contrib import admin

from fleet.models import Attempt, Gpu, Host, Job, RankPlacement

admin.site.register([Host, Gpu, Job, Attempt, RankPlacement])
