package nccl

import "errors"

func newNCCLComm(c *tcpComm) (DeviceComm, error) { return nil, errors.New("todo") }
