// Package deploy holds the operators' kit, which is files rather than Go:
// Prometheus alerting rules (prometheus/idemgate-alerts.yml, with promtool
// unit tests beside them) and a Grafana dashboard
// (grafana/idemgate-dashboard.json). Its tests run promtool on the rules and
// check that every metric the rules and the dashboard name is one the Dedupe
// service or the interceptor exports.
package deploy
