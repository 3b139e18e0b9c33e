package console

import (
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"

	"github.com/idemgate/idemgate/dedupesvc"
)

// quotaMetric is the service's counter of refusals for a quota, by quota
// (dedupesvc.Metrics).
const quotaMetric = "idemgate_dedupe_quota_exceeded_total"

// tenantRow is one namespace's usage against the caller quotas.
type tenantRow struct {
	Namespace             string
	Records, OutcomeBytes int64
	// RecordsShare and BytesShare are the usage as a share of its quota,
	// "" without one; Near is set from 90% of either quota on.
	RecordsShare, BytesShare string
	Near                     bool
}

// refusalRow is one quota's refusals since the service started.
type refusalRow struct {
	Quota string
	Count float64
}

type tenantsPage struct {
	Rows                 []tenantRow
	MaxRecords, MaxBytes int64
	// Unsupported says why no usage is listed, when none can be.
	Unsupported string
	Refusals    []refusalRow
	// Next continues the listing after this page; Paged is set past the
	// first.
	Next  template.URL
	Paged bool
}

func (c *Console) tenants(w http.ResponseWriter, r *http.Request, op operator) {
	after := r.URL.Query().Get("after")
	data := tenantsPage{MaxRecords: c.cfg.MaxRecords, MaxBytes: c.cfg.MaxBytes, Paged: after != ""}
	if c.cfg.Usage == nil {
		data.Unsupported = "This service's store does not list its namespaces' usage."
	} else {
		// One more tells whether a next page exists.
		usage, err := c.cfg.Usage.ListNamespaceUsage(r.Context(), after, PageSize+1)
		if err != nil {
			c.cfg.Logger.WarnContext(r.Context(), "console: listing the namespaces' usage failed", "error", err)
			c.fail(w, r, &op, http.StatusServiceUnavailable, "Usage not read", "The store did not list the namespaces' usage ("+err.Error()+"). Check its health (the overview), then reload.")
			return
		}
		if len(usage) > PageSize {
			usage = usage[:PageSize]
			data.Next = template.URL(url.Values{"after": {usage[PageSize-1].Namespace}}.Encode()) // #nosec G203 -- built by url.Values.Encode
		}
		for _, u := range usage {
			data.Rows = append(data.Rows, tenantRowOf(u, c.cfg.MaxRecords, c.cfg.MaxBytes))
		}
	}
	data.Refusals = c.refusals()
	c.render(w, http.StatusOK, "tenants", c.page(op, "Tenants", data))
}

func tenantRowOf(u dedupesvc.NamespaceUsage, maxRecords, maxBytes int64) tenantRow {
	row := tenantRow{Namespace: u.Namespace, Records: u.Records, OutcomeBytes: u.OutcomeBytes}
	share := func(n, limit int64) string {
		if limit <= 0 {
			return ""
		}
		if n*10 >= limit*9 {
			row.Near = true
		}
		return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(limit))
	}
	row.RecordsShare, row.BytesShare = share(u.Records, maxRecords), share(u.OutcomeBytes, maxBytes)
	return row
}

// refusals reads the service's quota refusal counters from its registry,
// as a scrape would; nil without a registry.
func (c *Console) refusals() []refusalRow {
	if c.cfg.Metrics == nil {
		return nil
	}
	families, err := c.cfg.Metrics.Gather()
	if err != nil {
		c.cfg.Logger.Warn("console: reading the service's metrics failed", "error", err)
	}
	var rows []refusalRow
	for _, f := range families {
		if f.GetName() != quotaMetric {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "quota" {
					rows = append(rows, refusalRow{Quota: l.GetValue(), Count: m.GetCounter().GetValue()})
				}
			}
		}
	}
	slices.SortFunc(rows, func(a, b refusalRow) int {
		if a.Quota < b.Quota {
			return -1
		}
		if a.Quota > b.Quota {
			return 1
		}
		return 0
	})
	return rows
}

// byteSize prints n bytes in binary units, as the quota flags take them.
func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
