module github.com/taskgate/workers

go 1.26

require (
	github.com/google/uuid v1.6.0
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
