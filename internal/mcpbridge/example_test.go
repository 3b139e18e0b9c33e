package mcpbridge_test

import (
	"encoding/json"
	"fmt"

	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	"github.com/idemgate/idemgate/internal/mcpbridge"
)

// The input schema and the policy class of a method, as the bridge lists it.
func ExampleSchema() {
	service := paymentsv1.File_examples_payments_v1_payments_proto.Services().ByName("PaymentsService")
	charge := service.Methods().ByName("ChargeCard")
	schema, _ := json.Marshal(mcpbridge.Schema(charge.Input()))
	fmt.Println(string(schema))
	fmt.Println(mcpbridge.Classify(charge), mcpbridge.Classify(service.Methods().ByName("GetBalance")))
	// Output:
	// {"additionalProperties":false,"properties":{"amountCents":{"anyOf":[{"type":"integer"},{"pattern":"^-?[0-9]+$","type":"string"}]},"customerId":{"type":"string"}},"type":"object"}
	// gated read_only
}
